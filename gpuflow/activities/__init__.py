"""activities"""
