"""What the build parent and its worker subprocess agree on (file names, protocol version)."""

WORKER_PROTOCOL = 2  # 2: fixed address space, canonical environment, ISA with every compile
RESULT_FILE = "result.json"
CODE_FILE = "code.hsaco"
ISA_FILE = "isa.s"
EXIT_PYTHON_ERROR = 3  # the worker caught an exception and described it in result.json
