"""The torch reference of the draft step (float64, CPU) and the independent dense model.

``step``: one TP rank's sharded, paged step from the kernels' own inputs, and the TP driver.
``dense``: the same block written plainly (no TP, no paging, no fp8).
``problem``: deterministic random problems that both, and the kernel tests, consume.
This is the only implementation of the step's math in the project: kernel tests, runner tests
and benchmarks import it.
"""

from mono_aot.reference.dense import DenseConfig, DenseDrafter, DenseRequest
from mono_aot.reference.problem import (
    Problem,
    RequestSpec,
    make_problem,
    random_model,
    random_packed_model,
    rope_cache,
)
from mono_aot.reference.step import (
    StepInputs,
    StepResult,
    TPResult,
    max_rel_error,
    rank_step,
    run_tp,
    step_rank,
)

__all__ = [
    "DenseConfig",
    "DenseDrafter",
    "DenseRequest",
    "Problem",
    "RequestSpec",
    "StepInputs",
    "StepResult",
    "TPResult",
    "make_problem",
    "max_rel_error",
    "random_model",
    "random_packed_model",
    "rank_step",
    "rope_cache",
    "run_tp",
    "step_rank",
]
