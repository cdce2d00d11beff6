"""The ``triplane`` command.

    triplane demo [--steps N] [--seed S]   train a tiny MLP, printing the falling loss
    triplane ops                          the op table: name, group, gradient, dtypes
    triplane version                      the installed version
"""

from __future__ import annotations

import time

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="triplane: run deep-learning compute graphs on a cluster (or in this process).")
console = Console()


@app.command()
def version() -> None:
    """Print the installed version."""
    import triplane

    console.print(f"triplane {triplane.__version__}")


@app.command()
def ops() -> None:
    """List the op table."""
    from triplane.proto import optable

    table = Table(title=f"triplane ops ({len(optable.names())})")
    for col in ("name", "group", "differentiable", "dtypes"):
        table.add_column(col)
    for name, op in sorted(optable.table().items(), key=lambda kv: (kv[1].group, kv[0])):
        if op.internal:
            continue
        table.add_row(name, op.group, "yes" if op.differentiable else "no", _dtypes_text(op.dtypes))
    console.print(table)


def _dtypes_text(dtypes: frozenset[str]) -> str:
    from triplane.proto import dtypes as dt

    if dtypes == dt.EVERY:
        return "all"
    if dtypes == dt.NUMERIC:
        return "numeric"
    if dtypes == dt.FLOATS:
        return "floats"
    return ", ".join(sorted(dtypes))


@app.command()
def demo(steps: int = typer.Option(40, min=1, max=10_000, help="gradient-descent steps"),
         seed: int = typer.Option(0, help="seed of the data and the initial weights")) -> None:
    """Fit a tiny MLP (4 -> 32 -> 1) with SGD, printing step and loss."""
    from triplane.demo import run_demo

    console.print(f"[bold]triplane demo[/bold]: MLP 4-32-1, SGD(momentum=0.9), {steps} steps, seed {seed}")
    t0 = time.perf_counter()
    losses = run_demo(steps, seed, on_step=lambda i, v: console.print(f"step {i:4d}  loss {v:.6f}"))
    dt = time.perf_counter() - t0
    console.print(f"loss {losses[0]:.6f} -> {losses[-1]:.6f} in {dt:.2f}s")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
