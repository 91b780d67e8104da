"""The spec: what every other package builds on, in plain Python (pydantic, no torch, no FlyDSL).

``layouts`` (the served geometries), ``arch`` (the supported targets), ``abi`` (the kernel
contract), ``errors`` (the one exception family and its exit codes) and ``util`` (digests,
canonical JSON, integer helpers). Nothing here imports anything above it in the data flow.
"""
