"""gpudriver: the driver footprint (device nodes, mock NVML library, nvidia-smi, procfs, engine config)."""
