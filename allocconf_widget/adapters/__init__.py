"""Adapters: the only code that talks to torch, NVML, the file system and the Jupyter server."""
