"""The kernel function name of each variant: the code object symbol is the name plus ``_0``."""

KERNEL_NAMES: dict[str, str] = {"narrow": "mono_drafter_narrow", "wide": "mono_drafter_wide"}
