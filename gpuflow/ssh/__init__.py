"""SSH: sessions, host keys, provisioning, and pushing and starting host agents."""
