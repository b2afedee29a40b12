"""Platform-specific code paths, each chosen per lowering platform (`cpu`: the few-row
kernel that makes a verification chunk cost about one step on a CPU)."""
