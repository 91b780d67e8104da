"""Layout specs: the geometry the drafter kernels are specialised on.

A spec is a TOML file in ``layouts/``; it is validated by the pydantic models below and every
quantity derived from it (per-rank rows, launch capacity, buffer sizes, wait ticks) is a property
here, computed in one place, so neither the kernels nor the runner type a number twice.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from mono_aot.spec import abi
from mono_aot.spec.arch import ARCHS, SUPPORTED_ARCHS
from mono_aot.spec.errors import LayoutError
from mono_aot.spec.plans import kernel_problems
from mono_aot.spec.util import canonical_json, sha256_hex

LAYOUT_SCHEMA_VERSION = 1
VARIANTS: tuple[str, ...] = ("narrow", "wide")
Variant = Literal["narrow", "wide"]

VECTOR_BYTES = 16  # one global_load_dwordx4: 16 fp8 weights
WAVE = 64
MAX_THREADS = 1024
# Tokens one launch may carry: the kernels keep a launch's activations in LDS-sized tiles and
# size the peer mailboxes by it; raising it is a kernel change, not a spec change.
MAX_LAUNCH_TOKENS = 128
TICKS_PER_SECOND = 100_000_000  # s_memrealtime: the constant 100 MHz clock


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class ModelGeometry(_Strict):
    """The draft model itself (whole model, before tensor parallelism)."""

    layers: int = Field(gt=0, description="decoder layers of the drafter")
    hidden: int = Field(gt=0, description="hidden size")
    heads: int = Field(gt=0, description="query heads")
    kv_heads: int = Field(gt=0, description="key/value heads")
    head_dim: int = Field(gt=0, description="dims per head")
    rotary_dim: int = Field(gt=0, description="leading dims of q and k that NeoX RoPE rotates")
    mlp: int = Field(gt=0, description="MLP (SwiGLU) intermediate width")
    norm_eps: float = Field(gt=0, lt=1, description="Gemma RMSNorm epsilon")
    swiglu_alpha: float = Field(gt=0, description="alpha of the clamped SwiGLU")
    swiglu_limit: float = Field(gt=0, description="clamp limit of the clamped SwiGLU")
    window: int = Field(
        default=0,
        ge=0,
        description=(
            "sliding window of every layer (vLLM's sliding_window): a query at position qp "
            "attends keys kp with kp > qp - window; 0 attends the whole context"
        ),
    )
    causal: bool = Field(
        default=False,
        description="a query also attends no key past its own position (vLLM's causal)",
    )


class Parallel(_Strict):
    tp: int = Field(gt=0, description="tensor-parallel degree")


class Serving(_Strict):
    """How vLLM feeds the drafter."""

    kv_block: int = Field(gt=0, description="tokens per paged KV cache block")
    qpr: int = Field(gt=0, description="query tokens per request in one draft step")
    max_reqs: int = Field(gt=0, description="most requests in one step (sizes runner buffers)")
    chunk_reqs: int = Field(gt=0, description="requests per kernel launch")
    wide_base: int = Field(gt=0, description="smallest request count served by the wide kernel")
    peer_wait_s: float = Field(
        gt=0, le=600, description="seconds a kernel waits for a peer rank before giving up"
    )


class WeightFormat(_Strict):
    """How the checkpoint's linear weights are quantised (``mono_aot/reference/weights.py``)."""

    format: Literal["fp8-row", "mxfp8"] = Field(
        default="fp8-row",
        description=(
            "fp8-row: the arch's fp8 codes with one fp32 scale per output row; mxfp8: OCP "
            "e4m3fn codes with one E8M0 (power-of-two) scale byte per block of inputs"
        ),
    )
    block: int = Field(default=32, gt=0, description="inputs sharing one mxfp8 scale")

    @property
    def scale_block(self) -> int:
        """Inputs per E8M0 scale byte; 0 for fp8-row (one fp32 scale per row)."""
        return self.block if self.format == "mxfp8" else 0


class KernelShape(_Strict):
    threads: int = Field(gt=0, description="threads per workgroup")


class Target(_Strict):
    ctas: int = Field(gt=0, description="workgroups per launch: one per CU of the arch")


# Fields that size runner buffers but never reach generated code: left out of the canonical form.
_NOT_CODEGEN = {("serving", "max_reqs")}
# Fields added after the first release: a spec that leaves one out means its default.
_ADDED = {("model", "window"), ("model", "causal"), ("weights", "format"), ("weights", "block")}


class Layout(_Strict):
    """One served model geometry. Construct through ``load_layout``/``parse_layout``."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        frozen=True,
        allow_inf_nan=False,
        ignored_types=(cached_property,),
    )

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    description: str = ""
    model: ModelGeometry
    parallel: Parallel
    serving: Serving
    weights: WeightFormat = WeightFormat()
    kernel: KernelShape
    targets: dict[str, Target] = Field(min_length=1)

    @model_validator(mode="after")
    def _rules(self) -> Layout:
        problems = list(_rule_problems(self))
        if problems:
            # one "field: rule" per line; the loader prefixes each with the file
            raise ValueError("\n".join(f"{f}: {r}" for f, r in problems))
        return self

    # ---- derived constants (the only place they are computed) ----

    @property
    def wait_ticks(self) -> int:
        """``peer_wait_s`` in ticks of the 100 MHz ``s_memrealtime`` clock."""
        return round(self.serving.peer_wait_s * TICKS_PER_SECOND)

    @property
    def q_heads_per_rank(self) -> int:
        return self.model.heads // self.parallel.tp

    @property
    def kv_heads_per_rank(self) -> int:
        return self.model.kv_heads // self.parallel.tp

    @property
    def q_rows_per_rank(self) -> int:
        """Rows of q in this rank's fused projection (and the input width of its o slice)."""
        return self.q_heads_per_rank * self.model.head_dim

    @property
    def kv_rows_per_rank(self) -> int:
        return self.kv_heads_per_rank * self.model.head_dim

    @property
    def qkv_rows_per_rank(self) -> int:
        """q heads, then K heads, then V heads of this rank."""
        return self.q_rows_per_rank + 2 * self.kv_rows_per_rank

    @property
    def o_cols_per_rank(self) -> int:
        """Row-parallel o projection: this rank's slice of its input dim."""
        return self.q_rows_per_rank

    @property
    def mlp_per_rank(self) -> int:
        return self.model.mlp // self.parallel.tp

    @property
    def gu_rows_per_rank(self) -> int:
        """Gate rows then up rows of this rank's slice of the MLP."""
        return 2 * self.mlp_per_rank

    @property
    def kv_entry_bytes(self) -> int:
        """Bytes of one cached token of one KV head: fp8 K then fp8 V (the cache's last dim)."""
        return 2 * self.model.head_dim

    @property
    def launch_tokens(self) -> int:
        """Token capacity of one launch: ``chunk_reqs * qpr``."""
        return self.serving.chunk_reqs * self.serving.qpr

    def variant_reqs(self, variant: Variant) -> tuple[int, int]:
        """Inclusive range of request counts a variant serves in one launch."""
        if variant == "narrow":
            return (1, self.serving.wide_base - 1)
        if variant == "wide":
            return (self.serving.wide_base, self.serving.chunk_reqs)
        raise ValueError(f"unknown variant {variant!r}; expected one of {', '.join(VARIANTS)}")

    def variant_tokens(self, variant: Variant) -> int:
        """Most tokens one launch of ``variant`` carries (its scratch is sized by it)."""
        return self.variant_reqs(variant)[1] * self.serving.qpr

    def variants(self) -> tuple[Variant, ...]:
        """Variants this layout has: no narrow kernel when ``wide_base`` is 1."""
        return ("wide",) if self.serving.wide_base == 1 else ("narrow", "wide")

    def scratch_bytes(self, variant: Variant) -> int:
        """Bytes of the scratch buffer one launch of ``variant`` needs (``mono_aot.spec.abi``)."""
        return abi.scratch_plan(self, variant).total

    @property
    def peer_bytes(self) -> int:
        """Bytes of each rank's peer (all-reduce mailbox) buffer (``mono_aot.spec.abi``)."""
        return abi.peer_plan(self).total

    @property
    def archs(self) -> tuple[str, ...]:
        return tuple(sorted(self.targets))

    def ctas(self, arch: str) -> int:
        try:
            return self.targets[arch].ctas
        except KeyError:
            raise LayoutError(
                [
                    f"layout {self.name}: targets: does not target {arch} (it targets {', '.join(self.archs)})"
                ]
            ) from None

    # ---- canonical form ----

    def canonical(self) -> dict[str, Any]:
        """The fields that affect code generation, with numbers normalised (floats as floats).

        The name, description, targets (arch and CTA count enter the key on their own) and
        runner-only sizes are left out, so renaming a file or adding a target reuses binaries.
        A field added after the first release (``_ADDED``) is left out while it holds its
        default, so a spec written before it existed keeps its digest and its binaries.
        """
        out: dict[str, Any] = {"layout_schema": LAYOUT_SCHEMA_VERSION}
        for section in ("model", "parallel", "serving", "weights", "kernel"):
            sub = getattr(self, section)
            schema = type(sub).model_fields
            fields = {
                k: (float(v) if isinstance(v, float) else v)
                for k, v in sub.model_dump().items()
                if (section, k) not in _NOT_CODEGEN
                and not ((section, k) in _ADDED and v == schema[k].default)
            }
            if fields or section != "weights":  # a section added whole: absent at defaults
                out[section] = fields
        return out

    def canonical_json(self) -> str:
        return canonical_json(self.canonical())

    @cached_property
    def digest(self) -> str:
        """sha256 of the canonical JSON: equal for specs that generate the same code."""
        return sha256_hex(self.canonical_json())


def _rule_problems(lay: Layout) -> Iterable[tuple[str, str]]:
    m, tp, s, k = lay.model, lay.parallel.tp, lay.serving, lay.kernel
    if m.heads % tp:
        yield "model.heads", f"{m.heads} heads must divide evenly over tp={tp}"
    if m.kv_heads % tp:
        yield "model.kv_heads", f"{m.kv_heads} KV heads must divide evenly over tp={tp}"
    if m.heads % m.kv_heads:
        yield "model.heads", f"{m.heads} heads must be a multiple of kv_heads={m.kv_heads}"
    if m.rotary_dim % 2:
        yield "model.rotary_dim", f"{m.rotary_dim} must be even (NeoX rotates pairs of halves)"
    if m.rotary_dim > m.head_dim:
        yield "model.rotary_dim", f"{m.rotary_dim} must not exceed head_dim={m.head_dim}"
    for field, width in (("model.hidden", m.hidden), ("model.mlp", m.mlp)):
        if width % tp:
            yield field, f"{width} must divide evenly over tp={tp}"
        elif (width // tp) % VECTOR_BYTES or width % VECTOR_BYTES:
            yield (
                field,
                (
                    f"{width} (and its per-rank slice {width // tp}) must be a multiple of the "
                    f"{VECTOR_BYTES}-byte vector width"
                ),
            )
    if (m.heads // max(tp, 1) * m.head_dim) % VECTOR_BYTES:
        yield "model.head_dim", f"q rows per rank must be a multiple of {VECTOR_BYTES}"
    wf = lay.weights
    if wf.format == "mxfp8":
        if wf.block % VECTOR_BYTES:
            yield (
                "weights.block",
                f"{wf.block} must be a multiple of the {VECTOR_BYTES}-byte vector width",
            )
        else:
            # each GEMV's input width on a rank: qkv and gate/up read hidden, o and down a slice
            for what, width in (
                ("model.hidden", m.hidden),
                ("model.heads", m.heads // max(tp, 1) * m.head_dim),
                ("model.mlp", m.mlp // max(tp, 1)),
            ):
                if width % wf.block:
                    yield (
                        what,
                        f"a GEMV input width of {width} is not a whole number of {wf.block}-input mxfp8 blocks",
                    )
    if not 1 <= s.wide_base <= s.chunk_reqs:
        yield "serving.wide_base", f"{s.wide_base} must be between 1 and chunk_reqs={s.chunk_reqs}"
    if s.chunk_reqs > s.max_reqs:
        yield "serving.chunk_reqs", f"{s.chunk_reqs} must not exceed max_reqs={s.max_reqs}"
    if s.chunk_reqs * s.qpr > MAX_LAUNCH_TOKENS:
        yield (
            "serving.chunk_reqs",
            (
                f"the largest launch, chunk_reqs x qpr = {s.chunk_reqs * s.qpr} tokens, exceeds the "
                f"kernels' limit of {MAX_LAUNCH_TOKENS}"
            ),
        )
    if k.threads % WAVE:
        yield "kernel.threads", f"{k.threads} must be a multiple of the {WAVE}-lane wavefront"
    if k.threads > MAX_THREADS:
        yield "kernel.threads", f"{k.threads} exceeds the hardware limit of {MAX_THREADS}"
    for arch in sorted(lay.targets):
        if arch not in SUPPORTED_ARCHS:
            yield (
                f"targets.{arch}",
                (
                    f"unknown arch; supported: {', '.join(SUPPORTED_ARCHS)} "
                    "(a new one is added in mono_aot/spec/arch.py)"
                ),
            )
        elif lay.targets[arch].ctas > ARCHS[arch].max_cus:
            info = ARCHS[arch]
            yield (
                f"targets.{arch}.ctas",
                f"{lay.targets[arch].ctas} workgroups cannot all be co-resident: {arch} has at "
                f"most {info.max_cus} CUs ({', '.join(info.products)})",
            )


# ---- loading ----


def _format_validation_error(err: ValidationError, source: str) -> list[str]:
    lines = []
    for e in err.errors(include_url=False):
        loc = ".".join(str(p) for p in e["loc"])
        msg = e["msg"]
        if not loc and msg.startswith("Value error, "):
            lines += [
                f"{source}: {line}" for line in msg.removeprefix("Value error, ").splitlines()
            ]
            continue
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        elif e["type"] == "missing":
            msg = "required key is missing"
        lines.append(f"{source}: {loc or '(top level)'}: {msg}")
    return lines


def parse_layout(
    data: Mapping[str, Any], source: str, name: str | None = None, *, kernels: bool = False
) -> Layout:
    """Validate a spec's mapping; ``LayoutError`` lists every problem as ``source: field: rule``.

    ``kernels``: also refuse a layout the drafter kernels cannot be built for, on any of its
    targets and variants (``mono_aot.spec.plans.kernel_problems``: the very plan code the
    kernels compile from). Spec files are always checked so (``load_layout``); a mapping made
    in memory for the torch reference may describe a geometry no kernel serves."""
    if not isinstance(data, Mapping):
        raise LayoutError([f"{source}: (top level): a spec must be a TOML table"])
    doc = dict(data)
    if name is not None:
        if "name" in doc and doc["name"] != name:
            raise LayoutError(
                [f"{source}: name: {doc['name']!r} differs from the file's stem {name!r}"]
            )
        doc.setdefault("name", name)
    try:
        lay = Layout.model_validate(doc)
    except ValidationError as err:
        raise LayoutError(_format_validation_error(err, source)) from None
    if kernels:
        bad = [f"{source}: {f}: {r}" for f, r in kernel_problems(lay)]
        if bad:
            raise LayoutError(bad)
    return lay


def load_layout(path: str | Path) -> Layout:
    """Load and validate ``path``; its stem is the layout's name. A spec file names kernels
    to build, so it must be buildable: ``parse_layout(..., kernels=True)``."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise LayoutError([f"{p}: cannot read: {e.strerror or e}"]) from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise LayoutError([f"{p}: not UTF-8 text (byte {e.start})"]) from None
    except tomllib.TOMLDecodeError as e:
        raise LayoutError([f"{p}: invalid TOML: {e}"]) from None
    return parse_layout(data, str(p), name=p.stem, kernels=True)


def spec_toml(layout: Layout) -> str:
    """The spec file of ``layout`` (its name is the file's stem, so it is left out)."""
    import tomli_w

    doc = layout.model_dump(mode="json")
    doc.pop("name")
    return tomli_w.dumps(doc)


def write_spec(layout: Layout, directory: str | Path) -> Path:
    """``directory/<name>.toml``, checked to load back into the same layout: how a layout made
    in memory (a derived one, a vLLM config's) reaches ``mono-aot build --layout PATH``."""
    path = Path(directory) / f"{layout.name}.toml"
    path.write_text(spec_toml(layout), encoding="utf-8")
    back = load_layout(path)
    if back.digest != layout.digest or back.targets != layout.targets:
        raise LayoutError([f"{path}: the written spec does not load back into {layout.name}"])
    return path


def shipped_layout_dir() -> Path:
    """Where the shipped specs are: inside an installed wheel, or the checkout's ``layouts/``."""
    package = Path(__file__).resolve().parents[1]  # .../mono_aot
    for candidate in (package / "_layouts", package.parent / "layouts"):
        if candidate.is_dir():
            return candidate
    return package / "_layouts"


# Specs kept for tests (the emulator's small layout), in a folder of their own: the shipped
# layouts are ``*.toml`` directly in the layout directory, and every default ("every shipped
# layout" in build, pack and coverage; "the one shipped layout" in selftest, bench and the vLLM
# hook) reads only those. A test layout is resolved by name like a shipped one.
TEST_LAYOUT_DIR = "test"


def shipped_layout_paths() -> list[Path]:
    return sorted(shipped_layout_dir().glob("*.toml"))


def layout_paths_for_tests() -> list[Path]:
    """The test layouts (``layouts/test/*.toml``): buildable specs no default selects."""
    return sorted((shipped_layout_dir() / TEST_LAYOUT_DIR).glob("*.toml"))


def resolve_layout(name_or_path: str) -> Layout:
    """A shipped or test layout by name, or any spec by path (anything with ``/`` or ``.toml``)."""
    if "/" in name_or_path or name_or_path.endswith(".toml"):
        return load_layout(name_or_path)
    for folder in (shipped_layout_dir(), shipped_layout_dir() / TEST_LAYOUT_DIR):
        path = folder / f"{name_or_path}.toml"
        if path.is_file():
            return load_layout(path)
    known = ", ".join(p.stem for p in shipped_layout_paths()) or "none"
    tests = ", ".join(p.stem for p in layout_paths_for_tests()) or "none"
    raise LayoutError(
        [f"layout {name_or_path!r}: no such shipped layout (shipped: {known}; for tests: {tests})"]
    )


def shipped_layouts() -> list[Layout]:
    return [load_layout(p) for p in shipped_layout_paths()]


def json_schema() -> dict[str, Any]:
    return Layout.model_json_schema()


__all__ = [
    "LAYOUT_SCHEMA_VERSION",
    "VARIANTS",
    "Layout",
    "Variant",
    "json_schema",
    "layout_paths_for_tests",
    "load_layout",
    "parse_layout",
    "resolve_layout",
    "shipped_layout_dir",
    "shipped_layout_paths",
    "shipped_layouts",
    "spec_toml",
    "write_spec",
]
