"""What runs on a GPU host: the host agent, its activities, NVML, samplers and host facts."""
