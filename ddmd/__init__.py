"""ddmd: a debug-monitor daemon for Java and Android VMs (the Dalvik Debug Monitor design)."""

__version__ = "0.1.0"
