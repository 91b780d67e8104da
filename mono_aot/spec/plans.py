"""What decides whether the drafter kernels can be built for a layout, arch and variant.

Plain Python (no FlyDSL): the projection plans (``GemvPlan`` for the narrow kernel's VALU GEMV,
``GemmPlan`` for the wide kernel's MFMA GEMM), the attention geometry and the LDS arena of the
kernel. The kernels compile from these very objects (``mono_aot.kernels`` imports them), and
the layout loader runs ``kernel_problems`` on every spec file, so ``mono-aot layouts validate``
rejects exactly what the build would refuse, as ``file: field: rule`` with the numbers.

Every CTA count from 32 to the arch's CUs builds for the shipped geometry: a workgroup whose
rows do not fit one pass of the GEMV's 64-lane reduction (narrow) or one reduction round of
the GEMM's LDS budget (wide) loops over row passes, each a full K sweep over its own rows, so
every weight byte is still read once per launch (README, "The drafter megakernels"). Where
the all-reduce tile grows past what the LDS holds beside the other regions (gfx942 wide at 32
and 33 CTAs), ``lds_arena`` overlays regions no phase uses together and ``lds_budgets`` gives
o and down the reduction budget the tile leaves.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mono_aot.spec import abi
from mono_aot.spec.arch import arch_info
from mono_aot.spec.errors import MonoUnsupported
from mono_aot.spec.util import align_up, ceil_div

if TYPE_CHECKING:  # the layout loader calls into this module: no import cycle
    from mono_aot.spec.layouts import Layout, Variant

WAVE = 64
SUPPORTED_TP = 4  # the user's runner is TP 4 (the signature itself follows abi.kernel_args)
GEMMS = ("valu", "mfma")


class PlanError(MonoUnsupported, ValueError):
    """A kernel plan cannot be built for this shape: the message names the plan, the rule and
    its numbers (the build reports it as one line, no traceback). ``field`` says what the rule
    is about: ``ctas`` (the target's CTA count), ``cols``, ``threads``, or a spec field."""

    def __init__(self, message: str, field: str = "ctas") -> None:
        self.field = field
        super().__init__(message)


def _raise(plan: str, problems: list[tuple[str, str]]) -> None:
    if problems:
        raise PlanError(f"{plan}: " + "; ".join(r for _, r in problems), field=problems[0][0])


def row_scale_bytes(cols: int, mx_block: int) -> int:
    """Scale bytes of one weight row of ``cols`` inputs: one fp32 (``mx_block`` 0, fp8-row), or
    one E8M0 byte per ``mx_block`` inputs (mxfp8)."""
    return cols // mx_block if mx_block else 4


class ProjectionRows:
    """How a projection plan's output rows split over workgroups (GemvPlan and GemmPlan share it).

    Needs the plan's ``rows``, ``pairs``, ``ctas`` and ``threads`` fields.
    """

    @property
    def waves(self) -> int:
        return self.threads // WAVE

    @property
    def seg_rows(self) -> int:
        """Rows split across workgroups: all rows, or the rows of one half of a pair matrix."""
        return self.rows // 2 if self.pairs else self.rows

    @property
    def rows_per_cta(self) -> int:
        """Most rows (or row pairs) one workgroup owns."""
        return ceil_div(self.seg_rows, self.ctas)

    @property
    def scale_row_bytes(self) -> int:
        """Scale bytes of one weight row (``row_scale_bytes``)."""
        return row_scale_bytes(self.cols, self.mx_block)

    @property
    def scale_layer_bytes(self) -> int:
        """Scale bytes of one layer's matrix (the stride of the stacked ``*_s`` tensor)."""
        return self.rows * self.scale_row_bytes

    def mx_problems(self) -> list[tuple[str, str]]:
        """A lane reads 16 weight bytes of one block and its row's scales as aligned words."""
        if self.mx_block and (self.mx_block % 16 or self.cols % (4 * self.mx_block)):
            return [(
                "cols",
                f"mxfp8 block {self.mx_block}: it must be a multiple of 16 and cols={self.cols} "
                "a multiple of 4 blocks",
            )]  # fmt: skip
        return []

    def cta_rows(self, cta: int) -> tuple[int, int]:
        """[first, end) of the rows (or row pairs) workgroup ``cta`` owns (host-side mirror)."""
        return (cta * self.seg_rows // self.ctas, (cta + 1) * self.seg_rows // self.ctas)


# ---------------------------------------------------------------------------------------------
# The narrow kernel's VALU GEMV (mono_aot.kernels.gemv)
# ---------------------------------------------------------------------------------------------

GEMV_LANE_K = 16  # K positions (bytes of fp8) one lane covers per tile: one 16-byte load
GEMV_KT = WAVE * GEMV_LANE_K  # K of one tile
GEMV_MAX_GROUP = 16  # tokens whose activations one K pass stages
# Most rows per wave in one pass: the register budget (256 VGPRs at two waves per SIMD). The
# shipped counts use at most 3; 4 rows of 16 tokens spilled 44-64 VGPRs (gfx942 at 228, 80 and
# 38 CTAs, gfx950 at 32), 3 per pass built clean.
GEMV_MAX_PASS_ROWS = 3
# mxfp8 holds each row's scale and its word offset too: 3 rows of 14 tokens spilled 17 (gfx942,
# 304 CTAs) and 72 (gfx950, 256) VGPRs of the real model's narrow kernel
GEMV_MAX_PASS_ROWS_MX = 2


@dataclass(frozen=True)
class GemvPlan(ProjectionRows):
    """Compile-time shape of one VALU GEMV (field names as ``GemmPlan``).

    A wave holds its rows' weights and (row, token) sums in registers and reduces them over
    its 64 lanes, so one K sweep serves at most ``64 // group`` rows per wave. A workgroup with
    more rows than that sweeps K once per *row pass* (``passes``), each over its own rows."""

    rows: int
    cols: int
    ctas: int
    max_tokens: int
    threads: int = 512
    pairs: bool = False
    x_stride: int = 0
    lds_budget: int = 0  # unused: the staging tile's size is fixed by the group size
    mx_block: int = 0  # 0: one fp32 scale per row; else one E8M0 byte per mx_block inputs
    fnuz: bool = False  # mxfp8 on an e4m3fnuz arch: e4m3fn codes read as half their value

    def __post_init__(self) -> None:
        problems: list[tuple[str, str]] = []
        if self.threads % WAVE or self.threads <= 0:
            problems.append(
                ("threads", f"threads={self.threads} must be a positive multiple of {WAVE}")
            )
            _raise(f"GemvPlan({self.rows}x{self.cols})", problems)
        if self.cols % GEMV_KT:
            problems.append(
                ("cols", f"cols={self.cols} must be a multiple of the {GEMV_KT}-wide K tile")
            )
        if self.pairs and self.rows % 2:
            problems.append(("rows", f"rows={self.rows} of a pair plan must be even"))
        if self.seg_rows < self.ctas:
            problems.append(
                ("ctas", f"{self.seg_rows} rows for {self.ctas} workgroups: every one needs a row")
            )
        if self.max_tokens <= 0:
            problems.append(("tokens", f"max_tokens={self.max_tokens} must be positive"))
        problems += self.mx_problems()
        _raise(f"GemvPlan({self.rows}x{self.cols})", problems)

    @property
    def per_wave(self) -> int:
        """Rows one wave computes over all passes (a pair plan's gate and up rows count
        separately)."""
        return ceil_div(self.local_rows, self.waves)

    @property
    def pass_limit(self) -> int:
        """Most rows per wave in one pass: their (row, token) sums fill the 64 lanes at most,
        and the registers hold ``GEMV_MAX_PASS_ROWS`` rows of weights and sums."""
        most = GEMV_MAX_PASS_ROWS_MX if self.mx_block else GEMV_MAX_PASS_ROWS
        return max(1, min(WAVE // self.group, most))

    @property
    def passes(self) -> int:
        """K sweeps per token group, each over its own rows (1 when the rows fit one)."""
        return ceil_div(self.per_wave, self.pass_limit)

    @property
    def pass_per_wave(self) -> int:
        """Rows per wave in one pass (balanced over the passes)."""
        return ceil_div(self.per_wave, self.passes)

    @property
    def pass_rows(self) -> int:
        """Local rows of one pass: pass p covers ``[p * pass_rows, (p + 1) * pass_rows)``."""
        return self.pass_per_wave * self.waves

    @property
    def group(self) -> int:
        return min(self.max_tokens, GEMV_MAX_GROUP)

    @property
    def groups(self) -> int:
        return ceil_div(self.max_tokens, self.group)

    @property
    def values_per_lane(self) -> int:
        return self.pass_per_wave * self.group

    @property
    def red_values(self) -> int:
        """Values the halving reduction works on: a power of two."""
        v = 1
        while v < self.values_per_lane:
            v *= 2
        return v

    @property
    def tiles(self) -> int:
        return self.cols // GEMV_KT

    @property
    def xs(self) -> int:
        return self.x_stride or self.cols

    @property
    def stage_bytes(self) -> int:
        """The staging tile: ``group`` tokens x one K tile of bf16."""
        return self.group * GEMV_KT * 2

    @property
    def local_rows(self) -> int:
        """Most rows a workgroup computes (both halves of a pair plan)."""
        return self.rows_per_cta * (2 if self.pairs else 1)

    @property
    def lds_bytes(self) -> int:
        """The staging tile, then the out tile (fp32 [local rows][group])."""
        return self.stage_bytes + self.local_rows * self.group * 4

    @property
    def weight_bytes(self) -> int:
        return self.rows * self.cols


# ---------------------------------------------------------------------------------------------
# The wide kernel's MFMA GEMM (mono_aot.kernels.mfma)
# ---------------------------------------------------------------------------------------------

TILE = 16  # rows (A) and tokens (B) of one v_mfma_f32_16x16x16_bf16 tile
LANE_K = 16  # K positions one lane covers per chunk: one 16-byte load of fp8 weights
CHUNK = (WAVE // TILE) * LANE_K  # 64: K of one wave's chunk (4 lane groups x 16)
PREFETCH_VGPRS = 96  # registers per lane the K loop may hold loads in flight in
DEFAULT_LDS_BUDGET = 16 * 1024  # bytes of the reduction buffer unless the caller allows more
MFMA_K: dict[str, int] = {"gfx942": 16, "gfx950": 32}  # the bf16 MFMA each arch runs at full rate


@dataclass(frozen=True)
class GemmPlan(ProjectionRows):
    """Compile-time shape of one GEMM phase (every field is a Python int or bool).

    ``rows`` x ``cols`` is the stored fp8 matrix of one layer (row-major, one fp32 scale per row).
    ``pairs``: the matrix is two stacked halves (gate rows then up rows); workgroup w gets the
    same row run of both halves, so its ``emit`` sees ``gate[j]`` and ``up[j]`` together.

    A workgroup's run is ``run_tiles`` 16-row tiles (per half). It sweeps K once per *row
    pass* of ``seg_tiles`` of them (``row_tiles`` with both halves of a pair plan): as many as
    one reduction round of one token tile fits in ``lds_budget``, which also bounds the
    accumulators a wave holds. Pass p covers the run's rows ``[p * seg_tiles * 16, ...)``.
    """

    rows: int
    cols: int
    ctas: int
    max_tokens: int
    threads: int = 512
    pairs: bool = False
    x_stride: int = 0  # activation row stride in elements (0: cols)
    lds_budget: int = DEFAULT_LDS_BUDGET
    min_tokens: int = 1  # the fewest tokens a caller passes (a speed hint: any n <= max is right)
    mfma_k: int = 16  # 16: v_mfma_f32_16x16x16_bf16 (gfx942); 32: v_mfma_f32_16x16x32_bf16 (gfx950)
    mx_block: int = 0  # as GemvPlan
    fnuz: bool = False

    def __post_init__(self) -> None:
        problems: list[tuple[str, str]] = []
        if self.threads % WAVE or self.threads <= 0:
            problems.append(
                ("threads", f"threads={self.threads} must be a positive multiple of {WAVE}")
            )
        elif self.cols % (CHUNK * self.waves):
            problems.append((
                "cols",
                f"cols={self.cols} must be a multiple of {CHUNK * self.waves} "
                f"({self.waves} waves x {CHUNK}-wide chunks)",
            ))  # fmt: skip
        if self.pairs and self.rows % 2:
            problems.append(("rows", f"rows={self.rows} must be even for a gate/up pair matrix"))
        if self.ctas <= 0 or self.seg_rows < self.ctas:
            problems.append((
                "ctas",
                f"{self.seg_rows} {'row pairs' if self.pairs else 'rows'} cannot give each of "
                f"{self.ctas} workgroups at least one",
            ))  # fmt: skip
        if not 1 <= self.min_tokens <= self.max_tokens:
            problems.append(
                ("tokens", f"tokens {self.min_tokens}..{self.max_tokens}: need 1 <= min <= max")
            )
        if self.mfma_k not in (16, 32):
            problems.append(("mfma_k", f"mfma_k={self.mfma_k} must be 16 or 32"))
        if self.x_stride and (self.x_stride < self.cols or self.x_stride % 8):
            problems.append((
                "cols",
                f"x_stride={self.x_stride} must be >= cols and a multiple of 8 (16 bytes)",
            ))  # fmt: skip
        problems += self.mx_problems()
        _raise(f"GemmPlan({self.rows}x{self.cols})", problems)
        if self.lds_budget < self.min_round_bytes:
            raise PlanError(
                f"GemmPlan({self.rows}x{self.cols}): lds_budget={self.lds_budget} is below one "
                f"reduction round ({self.min_round_bytes} bytes)"
            )

    # ---- derived (the only place they are computed) ----

    @property
    def halves(self) -> int:
        return 2 if self.pairs else 1

    @property
    def run_tiles(self) -> int:
        """16-row tiles of the largest run (per half of a pair matrix)."""
        return ceil_div(self.rows_per_cta, TILE)

    @property
    def min_round_bytes(self) -> int:
        """LDS of the smallest round: one row tile (per half), one token tile, every wave."""
        return self.waves * self.halves * TILE * TILE * 4

    @property
    def seg_tiles(self) -> int:
        """Row tiles (per half) of one row pass."""
        fit = self.lds_budget // self.min_round_bytes
        return max(1, min(self.run_tiles, fit))

    @property
    def passes(self) -> int:
        """Row passes (K sweeps) per call: 1 when the whole run fits one round."""
        return ceil_div(self.run_tiles, self.seg_tiles)

    @property
    def row_tiles(self) -> int:
        """16-row MFMA tiles of one pass (both halves for a pair matrix)."""
        return self.halves * self.seg_tiles

    @property
    def token_tiles(self) -> int:
        return ceil_div(self.max_tokens, TILE)

    @property
    def chunks_per_wave(self) -> int:
        return self.cols // (CHUNK * self.waves)

    @property
    def xs(self) -> int:
        return self.x_stride or self.cols

    @property
    def round_bytes(self) -> int:
        """LDS of one reduction round: every wave's fp32 partial of one token tile."""
        return self.waves * self.row_tiles * TILE * TILE * 4

    @property
    def tiles_per_round(self) -> int:
        return max(1, min(self.token_tiles, self.lds_budget // self.round_bytes))

    @property
    def rounds(self) -> int:
        return ceil_div(self.token_tiles, self.tiles_per_round)

    @property
    def lds_bytes(self) -> int:
        """Size of the ``red`` buffer the caller passes (fp32, 16-byte aligned)."""
        return self.round_bytes * self.tiles_per_round

    @property
    def lds_floats(self) -> int:
        return self.lds_bytes // 4

    @property
    def min_token_tiles(self) -> int:
        return ceil_div(self.min_tokens, TILE)

    def prefetch_for(self, nt: int) -> int:
        """Chunks whose loads are in flight ahead of the one being multiplied (by VGPR budget)."""
        # VGPRs one chunk's loads occupy (mxfp8: and a scale word per row tile)
        per_chunk = (5 if self.mx_block else 4) * self.row_tiles + 8 * nt
        return (
            max(1, min(self.chunks_per_wave - 1, PREFETCH_VGPRS // per_chunk))
            if self.chunks_per_wave > 1
            else 0
        )

    @property
    def weight_bytes(self) -> int:
        return self.rows * self.cols


# ---------------------------------------------------------------------------------------------
# The four projections of a layer
# ---------------------------------------------------------------------------------------------

# the spec field each projection's K width comes from (where a ``cols`` rule points)
PROJECTION_COLS = {"qkv": "model.hidden", "o": "model.heads", "gu": "model.hidden",
                   "down": "model.mlp"}  # fmt: skip


def _shapes(layout: Layout) -> dict[str, tuple[int, int, bool]]:
    h = layout.model.hidden
    return {
        "qkv": (layout.qkv_rows_per_rank, h, False),
        "o": (h, layout.o_cols_per_rank, False),
        "gu": (layout.gu_rows_per_rank, h, True),
        "down": (h, layout.mlp_per_rank, False),
    }


def rank_weight_bytes(layout: Layout) -> int:
    """Bytes of one rank's fp8 projection weights, every layer (what a launch streams)."""
    return layout.model.layers * sum(r * c for r, c, _ in _shapes(layout).values())


def rank_scale_bytes(layout: Layout) -> int:
    """Bytes of one rank's weight scales, every layer."""
    mx = layout.weights.scale_block
    return layout.model.layers * sum(
        r * row_scale_bytes(c, mx) for r, c, _ in _shapes(layout).values()
    )


def kv_bytes_per_position(layout: Layout) -> int:
    """Cache bytes attention reads per attended position, every layer (K and V of the rank's
    KV heads)."""
    return layout.model.layers * layout.kv_heads_per_rank * layout.kv_entry_bytes


def attended_positions(layout: Layout, context: int) -> int:
    """Positions one request of ``context`` cached tokens plus its QPR rows reads: all of them,
    or with a window only the ``window - 1 + qpr`` its queries can see."""
    seen = context + layout.serving.qpr
    w = layout.model.window
    return min(seen, w - 1 + layout.serving.qpr) if w else seen


def launch_bytes(layout: Layout, requests: int, context: int) -> dict[str, int]:
    """HBM bytes one launch of ``requests`` requests at ``context`` streams on one rank: every
    weight and scale byte once, and each request's attended K/V (the README's performance
    model)."""
    kv = requests * attended_positions(layout, context) * kv_bytes_per_position(layout)
    w, s = rank_weight_bytes(layout), rank_scale_bytes(layout)
    return {"weights": w, "scales": s, "kv": kv, "total": w + s + kv}


def _plan_kwargs(
    layout: Layout, arch: str, variant: Variant, gemm: str, lds_budget: int
) -> dict[str, int]:
    common = {
        "ctas": layout.ctas(arch),
        "max_tokens": layout.variant_tokens(variant),
        "threads": layout.kernel.threads,
    }
    if layout.weights.scale_block:
        common.update(
            mx_block=layout.weights.scale_block, fnuz=arch_info(arch).fp8_format == "e4m3fnuz"
        )
    if gemm == "mfma":
        if arch not in MFMA_K:
            raise ValueError(
                f"no MFMA GEMM for arch {arch!r} (supported: {', '.join(sorted(MFMA_K))})"
            )
        common.update(
            lds_budget=lds_budget,
            min_tokens=layout.variant_reqs(variant)[0] * layout.serving.qpr,
            mfma_k=MFMA_K[arch],
        )
    return common


def projection_plan(
    layout: Layout,
    arch: str,
    variant: Variant,
    name: str,
    gemm: str | None = None,
    lds_budget: int | None = None,
) -> GemvPlan | GemmPlan:
    """One projection's plan (``name`` in ``PROJECTION_COLS``); ``PlanError`` if it cannot be
    built. ``lds_budget`` None: the kernel's own (``lds_budgets``)."""
    gemm = gemm or default_gemm(variant)
    if gemm not in GEMMS:
        raise ValueError(f"unknown GEMV phase {gemm!r}; expected one of {', '.join(GEMMS)}")
    if lds_budget is None:
        lds_budget = lds_budgets(layout, arch, variant, gemm)[name]
    rows, cols, pairs = _shapes(layout)[name]
    cls = GemmPlan if gemm == "mfma" else GemvPlan
    return cls(rows, cols, pairs=pairs, **_plan_kwargs(layout, arch, variant, gemm, lds_budget))


def projection_plans(
    layout: Layout,
    arch: str,
    variant: Variant,
    gemm: str | None = None,
    lds_budget: int | None = None,
) -> dict[str, GemvPlan | GemmPlan]:
    """The four projections of a layer (per rank) for ``variant`` on ``arch``.

    qkv: ``[qkv_rows, hidden]``; o: ``[hidden, o_cols]``; gu: ``[2 * mlp, hidden]`` as a pair
    matrix (gate row j with up row j); down: ``[hidden, mlp]``. As MFMA GEMMs (``gemm`` "mfma",
    the wide kernel's default) token tiles cover the variant's request range (the versions
    below its fewest tokens are not built: the smallest one serves them) and the MFMA is the
    arch's full-rate bf16 one; as VALU GEMVs ("valu", the narrow kernel's default).
    ``lds_budget`` None: each projection's budget in the kernel (``lds_budgets``); an int: that
    budget for every projection (tests, the standalone MFMA kernel)."""
    budgets = (
        lds_budgets(layout, arch, variant, gemm)
        if lds_budget is None
        else dict.fromkeys(PROJECTION_COLS, lds_budget)
    )
    return {k: projection_plan(layout, arch, variant, k, gemm, budgets[k]) for k in PROJECTION_COLS}


def gemm_plans(
    layout: Layout, arch: str, variant: Variant = "wide", lds_budget: int | None = None
) -> dict[str, GemmPlan]:
    """``projection_plans`` as MFMA GEMMs."""
    return projection_plans(layout, arch, variant, "mfma", lds_budget)  # type: ignore[return-value]


def default_gemm(variant: Variant) -> str:
    """The projection phase each variant uses unless told otherwise."""
    return "mfma" if variant == "wide" else "valu"


# ---------------------------------------------------------------------------------------------
# Attention geometry (mono_aot.kernels.attention)
# ---------------------------------------------------------------------------------------------

MFMA_N = 16  # rows / cols of one v_mfma_f32_16x16x16_bf16 tile
K_ROW_PAD = 16  # LDS bytes after each staged K row: conflict-free 16-byte reads of 8 rows


def attention_problems(layout: Layout) -> list[tuple[str, str]]:
    """(spec field, rule) for each geometry the attention phases are not written for."""
    m, s = layout.model, layout.serving
    threads = layout.kernel.threads
    waves = threads // WAVE
    heads = layout.q_heads_per_rank
    problems = []
    if m.head_dim != 128:
        problems.append(
            (
                "model.head_dim",
                f"head_dim {m.head_dim} (the MFMA operand layout is written for 128)",
            )
        )
    if layout.kv_heads_per_rank != 1:
        problems.append(
            ("model.kv_heads", f"{layout.kv_heads_per_rank} KV heads per rank (written for 1)")
        )
    if s.qpr * heads > MFMA_N * waves:
        problems.append((
            "serving.qpr",
            f"qpr x q heads per rank = {s.qpr * heads} query rows per request, but the "
            f"{waves} waves of a workgroup hold at most {MFMA_N * waves} (16 each)",
        ))  # fmt: skip
    if heads % 2:
        problems.append(("model.heads", f"{heads} q heads per rank (the prep phase pairs them)"))
    if (m.rotary_dim // 2) % 4:
        problems.append(
            ("model.rotary_dim", f"rotary_dim {m.rotary_dim} (half of it must be a multiple of 4)")
        )
    if threads % (8 * MFMA_N):
        problems.append(("kernel.threads", f"{threads} threads (staging needs a multiple of 128)"))
    return problems


@dataclass(frozen=True)
class AttnGeometry:
    """Every compile-time number the attention phases use, derived from the layout once."""

    arch: str
    ctas: int
    threads: int
    waves: int
    head_dim: int
    heads: int  # q heads of this rank
    qpr: int
    rows: int  # query rows of one request: qpr * heads
    rotary: int
    kv_block: int
    qkv_rows: int
    q_rows: int
    eps: float
    max_reqs: int  # most requests one launch of the variant carries
    fp8_max: float
    chunk: int  # KV positions staged in LDS per step
    min_partition: int
    slots: int  # partial-result slots in scratch
    off_qkv: int
    off_attn: int
    off_part: int
    off_ml: int

    @property
    def k_stride(self) -> int:
        return self.head_dim + K_ROW_PAD

    @property
    def v_base(self) -> int:
        """LDS byte offset of the staged V rows (after the K rows)."""
        return self.chunk * self.k_stride

    @property
    def lds_bytes(self) -> int:
        return self.v_base + self.chunk * self.head_dim

    # ---- where each lane's MFMA operands live. Plain arithmetic, so the kernel calls these
    # with DSL values and the tests with ints (tests/kernels/test_attention.py emulates the
    # lanes and the documented MFMA register layout with them). ``nn`` = lane % 16 (a query
    # row of the wave's 16), ``grp`` = lane // 16.

    def stage_k_word(self, srow, seg):
        """LDS int32 word where staging thread (srow, seg < 4) puts its 32 K bytes."""
        return srow * (self.k_stride // 4) + seg * 8

    def stage_v_word(self, srow, seg):
        """LDS int32 word where staging thread (srow, seg >= 4) puts its 32 V bytes."""
        return self.v_base // 4 + srow * (self.head_dim // 4) + (seg - 4) * 8

    def k_frag_word(self, tile, nn, grp):
        """First of the 8 words (K dims 32 grp .. 32 grp + 31, see ``qk_dim``) of position
        ``tile * 16 + nn`` a lane feeds to ``S^T = K Q^T`` as operand A."""
        return (tile * MFMA_N + nn) * (self.k_stride // 4) + grp * 8

    def qk_dim(self, grp, step, e):
        """The head dim of element ``e`` of k-step ``step`` of a lane's A (K) and B (q) operands
        (``2 * mfma_words`` elements a step: K bytes / q floats ``step * 2 * mfma_words + e`` of
        the lane's contiguous 32)."""
        return grp * 32 + step * 2 * self.mfma_words + e

    def score_pos(self, tile, grp, j):
        """Chunk position of element ``j`` of a lane's S^T accumulator (and of its P^T operand)."""
        return tile * MFMA_N + grp * 4 + j

    def pv_pos(self, step, grp, e):
        """Chunk position of element ``e`` of a lane's P^T and V^T operands in PV step ``step``:
        a step covers ``mfma_words // 2`` score tiles (elements 4i..4i+3 are tile i's S^T
        accumulator, as the softmax left it in the lane)."""
        per = self.mfma_words // 2
        return self.score_pos(step * per + e // 4, grp, e % 4)

    def v_frag_word(self, pos, nn):
        """The 2 words (V dims ``v_dim(nn, 0..7)``) of chunk position ``pos`` a lane reads for
        its V^T operands of ``O^T = V^T P^T`` (byte t feeds M-tile t)."""
        return self.v_base // 4 + pos * (self.head_dim // 4) + nn * 2

    def v_dim(self, nn, t):
        """The head dim of byte ``t`` of a lane's V fragment (row ``nn`` of M-tile ``t``)."""
        return nn * 8 + t

    def out_dim(self, grp, j, t):
        """The head dim of element ``j`` of a lane's O^T accumulator of M-tile ``t``
        (``v_dim(4 * grp + j, t)``): a lane ends with dims 32 grp .. 32 grp + 31."""
        return self.v_dim(grp * 4 + j, t)

    @property
    def mfma_words(self) -> int:
        """Operand words a lane feeds one MFMA: 4 (``v_mfma_f32_16x16x32_bf16``, gfx950: k =
        32, twice the 16-deep instruction's work for the same issue) or 2 (gfx942)."""
        return 4 if self.arch == "gfx950" else 2

    @property
    def prep_tasks_per_token(self) -> int:
        """Wave tasks of the prep phase per token: q head pairs, then K+V."""
        return self.heads // 2 + 1

    @classmethod
    def build(cls, layout: Layout, arch: str, variant: Variant) -> AttnGeometry:
        m, s = layout.model, layout.serving
        threads = layout.kernel.threads
        waves = threads // WAVE
        heads = layout.q_heads_per_rank
        problems = attention_problems(layout)
        if problems:
            raise PlanError(
                f"layout {layout.name}: the attention phases do not support "
                + "; ".join(rule for _, rule in problems),
                field=problems[0][0],
            )
        plan = abi.scratch_plan(layout, variant)
        chunk = threads // 8
        return cls(
            arch=arch,
            ctas=layout.ctas(arch),
            threads=threads,
            waves=waves,
            head_dim=m.head_dim,
            heads=heads,
            qpr=s.qpr,
            rows=s.qpr * heads,
            rotary=m.rotary_dim,
            kv_block=s.kv_block,
            qkv_rows=layout.qkv_rows_per_rank,
            q_rows=layout.q_rows_per_rank,
            eps=float(m.norm_eps),
            max_reqs=layout.variant_reqs(variant)[1],
            fp8_max=arch_info(arch).fp8_max,
            chunk=chunk,
            min_partition=align_up(abi.ATTN_PARTITION, chunk),
            slots=abi.attn_partial_slots(layout, variant),
            off_qkv=plan.offset("qkv"),
            off_attn=plan.offset("attn"),
            off_part=plan.offset("attn_part"),
            off_ml=plan.offset("attn_ml"),
        )


def attention_split(g: AttnGeometry, seq_lens: list[int]) -> tuple[int, list[int]]:
    """The split the device computes (``split_plan`` in ``attention_phases``), on the host:
    (partition length, tasks per request). Tests use it to check the slot bound and to know
    which requests a case splits; the kernels never call it."""
    lens = [max(int(s), 0) for s in seq_lens]
    per_cta = ceil_div(sum(lens), g.ctas)
    part = max(ceil_div(per_cta, g.chunk) * g.chunk, g.min_partition)
    return part, [max(1, ceil_div(s, part)) for s in lens]


# ---------------------------------------------------------------------------------------------
# The kernel: its sync table and LDS arena (mono_aot.kernels.drafter)
# ---------------------------------------------------------------------------------------------

# What the LDS table carries from the prologue to every phase (kernels.common.KernelCtx)
TABLE_SCALARS = ("rank", "n", "bt_stride", "step_value", "par", "epoch", "seq")


def table_addrs(tp: int) -> tuple[str, ...]:
    return tuple(a.name for a in abi.kernel_args(tp) if a.kind == "i64")


def table_words(tp: int) -> int:
    return 2 * len(table_addrs(tp)) + len(TABLE_SCALARS)


# The projections whose results go to the all-reduce tile (their emits write it while their
# own reduction buffer is in use); qkv and gu emit through the rstd vector instead.
ROW_PARALLEL = ("o", "down")
SYNC_WORDS = 4  # int32 words after the arena (kernels.drafter: the sync_lds allocation)


@dataclass(frozen=True)
class LdsArena:
    """The kernel's LDS: the arena ``[0, red)`` for the GEMV's or attention's own use, then
    rstd ``[n_max]`` f32, then the per-workgroup tile ``[n_max][mbox rows]`` f32 (o/down
    partials; the receive's squares); after the arena 4 sync words and the table.

    ``overlaid``: the separate regions exceed the CU's LDS, so rstd and the tile start where
    the reductions that are live beside them end and share bytes with attention's staging
    and with each other (see ``lds_arena``)."""

    red: int
    off_rstd: int
    off_tile: int
    arena: int
    words: int  # int32 words of the arena allocation
    table_words: int
    total: int
    limit: int  # the CU's LDS (ArchInfo.lds_bytes_per_cu)
    overlaid: bool = False


def _tile_bytes(layout: Layout, variant: Variant) -> int:
    return layout.variant_tokens(variant) * abi.mbox_rows(layout) * 4


def _tail_bytes(layout: Layout) -> int:
    """LDS after the arena: the sync words and the table."""
    return SYNC_WORDS * 4 + align_up(table_words(layout.parallel.tp), 4) * 4


def _arena(
    layout: Layout,
    arch: str,
    variant: Variant,
    proj: dict[str, GemvPlan | GemmPlan],
    overlaid: bool,
) -> LdsArena:
    attn = AttnGeometry.build(layout, arch, variant)
    n_max = layout.variant_tokens(variant)
    rstd_bytes = align_up(n_max * 4, 256)
    if overlaid:
        red = align_up(attn.lds_bytes, 256)
        off_rstd = align_up(max(proj[k].lds_bytes for k in PROJECTION_COLS
                                if k not in ROW_PARALLEL), 256)  # fmt: skip
        off_tile = align_up(max(proj[k].lds_bytes for k in ROW_PARALLEL), 256)
        arena = max(red, off_rstd + rstd_bytes, off_tile + _tile_bytes(layout, variant))
    else:
        red = align_up(max(max(p.lds_bytes for p in proj.values()), attn.lds_bytes), 256)
        off_rstd = red
        off_tile = off_rstd + rstd_bytes
        arena = off_tile + _tile_bytes(layout, variant)
    words = ceil_div(arena, 16) * 4
    tw = align_up(table_words(layout.parallel.tp), 4)
    total = words * 4 + SYNC_WORDS * 4 + tw * 4
    return LdsArena(
        red, off_rstd, off_tile, arena, words, tw, total, arch_info(arch).lds_bytes_per_cu,
        overlaid,
    )  # fmt: skip


def lds_budgets(
    layout: Layout, arch: str, variant: Variant, gemm: str | None = None
) -> dict[str, int]:
    """Each projection's reduction budget in the kernel: ``DEFAULT_LDS_BUDGET``, unless the
    separate arena then exceeds the CU's LDS (the all-reduce tile grows as the CTA count
    falls: 48 KiB at 32 or 33 CTAs). Then o and down, whose reduction is live beside the tile
    (``lds_arena``'s overlaid layout), get what the tile leaves, at most the default: fewer
    row tiles per pass, more passes, the same weight bytes. qkv and gu keep the default."""
    gemm = gemm or default_gemm(variant)
    budgets = dict.fromkeys(PROJECTION_COLS, DEFAULT_LDS_BUDGET)
    if gemm != "mfma":
        return budgets  # the GEMV's LDS is fixed by its group size
    try:
        proj = projection_plans(layout, arch, variant, gemm, DEFAULT_LDS_BUDGET)
    except PlanError:
        return budgets  # projection_plan reports it
    separate = _arena(layout, arch, variant, proj, overlaid=False)
    if separate.total <= separate.limit:
        return budgets
    left = separate.limit - _tail_bytes(layout) - _tile_bytes(layout, variant)
    for k in ROW_PARALLEL:
        rnd = proj[k].min_round_bytes  # type: ignore[union-attr]
        if left >= rnd:  # else lds_arena reports the overflow
            budgets[k] = min(DEFAULT_LDS_BUDGET, left // rnd * rnd)
    return budgets


def lds_arena(layout: Layout, arch: str, variant: Variant, gemm: str | None = None) -> LdsArena:
    """The arena of one kernel; ``PlanError`` when it exceeds the CU's LDS.

    The separate layout gives every region its own bytes (the shipped counts use it). When
    that exceeds the CU's LDS, the overlaid one is used: the phases run one after another with
    workgroup barriers between them, and rstd (qkv, gu, the final norm), the tile (o, down,
    the receives, embed) and attention's staging are never live in the same phase, so rstd
    starts after qkv's and gu's reduction buffers, the tile after o's and down's, and
    attention's staging may cover both."""
    proj = projection_plans(layout, arch, variant, gemm)
    out = _arena(layout, arch, variant, proj, overlaid=False)
    if out.total <= out.limit:
        return out
    over = _arena(layout, arch, variant, proj, overlaid=True)
    if over.total <= over.limit:
        return over
    n_max = layout.variant_tokens(variant)
    raise PlanError(
        f"{out.total} bytes of LDS exceed the CU's {out.limit}: GEMV/attention {out.red} + rstd "
        f"{out.off_tile - out.off_rstd} + all-reduce tile {n_max} tokens x "
        f"{abi.mbox_rows(layout)} rows x 4 = {out.arena - out.off_tile} + sync and table "
        f"{out.total - out.words * 4}; overlaid (the tile after o/down's {over.off_tile}-byte "
        f"reduction) {over.total}"
    )


def kernel_problems_for(
    layout: Layout, arch: str, variant: Variant, gemm: str | None = None
) -> list[tuple[str, str]]:
    """(spec field, rule) for every reason the ``variant`` kernel cannot be built for ``arch``
    (the checks ``mono_aot.kernels.drafter.make_launcher`` runs, in the same code)."""
    out: list[tuple[str, str]] = []
    ctas_field = f"targets.{arch}.ctas"
    if layout.parallel.tp != SUPPORTED_TP:
        out.append(("parallel.tp", f"tp={layout.parallel.tp}; the kernels are written for tp=4"))
    m = layout.model
    if m.causal:
        out.append(("model.causal", "the kernels' attention is non-causal within a request"))
    attn = attention_problems(layout)
    out += [(f, f"the attention phases do not support {r}") for f, r in attn]
    if out:
        return out
    ctas = layout.ctas(arch)
    plans_ok = True
    for name, spec_field in PROJECTION_COLS.items():
        try:
            projection_plan(layout, arch, variant, name, gemm)
        except PlanError as e:
            plans_ok = False
            field = spec_field if e.field == "cols" else ctas_field
            if e.field == "threads":
                field = "kernel.threads"
            out.append((field, f"{ctas} workgroups, {variant} kernel, {name}: {e}"))
    if plans_ok:
        try:
            lds_arena(layout, arch, variant, gemm)
        except PlanError as e:
            out.append((ctas_field, f"{ctas} workgroups, {variant} kernel: {e}"))
    return out


def kernel_problems(layout: Layout) -> Iterator[tuple[str, str]]:
    """(spec field, rule) for every kernel of every target of ``layout`` that cannot be
    built, each rule once."""
    seen = set()
    for arch in sorted(layout.targets):
        for variant in layout.variants():
            for item in kernel_problems_for(layout, arch, variant):
                if item not in seen:
                    seen.add(item)
                    yield item
