"""mono-aot: ahead-of-time FlyDSL kernel builds and a verified artifact store for AMD GPUs."""

__version__ = "0.1.0"
