"""The text table of a ``mono-aot bench`` run (``run_bench``'s document)."""

from __future__ import annotations

from typing import Any

SECTIONS = (
    ("baseline", "Baseline"),
    ("jit", "1. What a rank pays today: FlyDSL just in time, empty cache, fresh process"),
    ("flydsl-warm", "2. FlyDSL warm disk cache, fresh process (RUN_ONLY, COMPILE_ONLY)"),
    ("bind", "3. mono-aot warm bind, fresh process with torch imported"),
    ("build", "4. Builds"),
    ("imports", "5. Imports"),
    ("calls", "6. Per call in a warm process: FlyDSL's JIT launcher, mono-aot's launcher"),
)


def seconds(x: float | None) -> str:
    if x is None:
        return "-"
    if x < 1e-3:
        return f"{x * 1e6:.0f} us"
    if x < 1.0:
        return f"{x * 1e3:.1f} ms"
    return f"{x:.2f} s"


def size(n: int | None) -> str:
    if n is None:
        return "-"
    if n >= 1 << 30:
        return f"{n / (1 << 30):.2f} GiB"
    if n >= 1 << 20:
        return f"{n / (1 << 20):.1f} MiB"
    return f"{n / 1024:.1f} KiB"


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [r[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)
        ]
        out.append("  ".join(cells).rstrip())
    return out


def render(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    lines = [
        f"mono-aot bench ({doc['mode']}): {m['cores']} cores, {m['machine']} {m['system']}, "
        f"Python {m['python']}, GPU: {m['gpu']}, load average at start "
        f"{m['load_average_1min_at_start']}",
        f"layout {doc['layout']}, archs {', '.join(doc['archs'])}, -j N = {doc['jobs']}, "
        f"HIP: {doc['hip']}",
        "times: wall clock median / min / max over the runs; cpu: median CPU seconds "
        "(user + system) of the same runs",
        "",
    ]
    figs = doc["figures"]
    for item, title in SECTIONS:
        rows = [["figure", "runs", "median", "min", "max", "cpu"]]
        for name in doc.get("figure_order") or sorted(figs):
            f = figs[name]
            if f["item"] != item:
                continue
            if f["skipped"] is not None:
                rows.append([f["label"], "-", f"({f['skipped']})", "", "", ""])
                continue
            w, c = f["wall"], f["cpu"]
            rows.append(
                [
                    f["label"],
                    str(f["runs"]),
                    seconds(w["median"]),
                    seconds(w["min"]),
                    seconds(w["max"]),
                    seconds(c["median"]) if c else "-",
                ]
            )
        if len(rows) > 1:
            lines.append(title)
            lines += ["  " + ln for ln in _table(rows)]
            lines.append("")
    lines.append("7. Sizes")
    s = doc["sizes"]
    skipped = s.get("skipped", {})
    rows = [["what", "size"]]
    rows.append(["mono-aot wheel", size(s["mono_aot_wheel"]) if s["mono_aot_wheel"] else
                 f"({skipped.get('mono_aot_wheel', 'not measured')})"])  # fmt: skip
    rows.append(["serving install: the wheel alone (fresh venv, --no-deps)",
                 size(s["serving_install"]) if s["serving_install"] else
                 f"({skipped.get('serving_install', 'not measured')})"])  # fmt: skip
    deps = s.get("runtime_deps") or {}
    if deps:
        biggest = sorted(deps["by_dist"].items(), key=lambda kv: -kv[1])[:3]
        top = ", ".join(f"{k} {size(v)}" for k, v in biggest)
        rows.append([f"  + runtime deps as installed here ({top}, ...)", size(deps["total"])])
    for arch, n in s["pack_wheels"].items():
        rows.append([f"pack wheel {arch}", size(n) if n else
                     f"({skipped.get(f'pack_wheel/{arch}', 'not measured')})"])  # fmt: skip
    lines += ["  " + ln for ln in _table(rows)]
    lines.append("")
    lines.append("Ratios (quotients of medians of this run)")
    rows = [["ratio", "basis", "value"]]
    for r in doc["ratios"].values():
        rows.append([r["label"], r["basis"], f"{r['value']:.1f}x" if r["value"] else "-"])
    lines += ["  " + ln for ln in _table(rows)]
    lines.append("")
    lines.append("Targets")
    rows = [["target", "measured", "verdict"]]
    for t in doc["targets"]:
        v = t["value"]
        shown = "-" if v is None else (f"{v:.1f}x" if "10x" in t["target"] else seconds(v))
        verdict = "not measured" if t["met"] is None else ("met" if t["met"] else "MISSED")
        rows.append([t["target"], shown, verdict])
    lines += ["  " + ln for ln in _table(rows)]
    lines.append("")
    lines.append("Not measured here (no GPU):")
    for nm in doc["not_measured"]:
        lines.append(f"  - {nm['what']}: not measured ({nm['why']})")
    for n in doc["notes"]:
        lines.append(f"note: {n}")
    lines.append(f"bench took {doc['seconds']:.0f} s")
    return "\n".join(lines)
