"""`kvaudit explain`: why a request missed, page by page (docs/design.md section 7).

The causes come from `kvaudit.analyse.explain` (the named query `explain`). What the
misses cost is the simulator's cost model (docs/boundaries.md): each missed page is
prefilled after the tokens before it, on the model the replica declares
(`kvaudit.kv.model`, when it names a preset) or the one `--model` gives, on `--gpu`.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Final

from kvaudit.causes import DROPPED
from kvaudit.commands import SUMMARIES
from kvaudit.commands.arguments import (
    TRACE_PATHS_HELP,
    UsageError,
    add_backend_option,
    command_parser,
    open_backend,
    warn_backend_read_errors,
)
from kvaudit.safe_text import visible
from kvaudit.simulator.hardware import GPUS, load_gpu
from kvaudit.simulator.model import PRESETS, CostModel, ModelGeometry, load_model

if TYPE_CHECKING:
    from kvaudit.analyse.explain import Explanation
    from kvaudit.backends import Backend


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(
        subparsers,
        "explain",
        SUMMARIES["explain"],
        "kvaudit explain traces/ chat-12-t3 --replica r2 --format json",
    )
    parser.add_argument("paths", nargs="*", metavar="PATH", help=TRACE_PATHS_HELP)
    parser.add_argument("request_id", metavar="REQUEST_ID", help="the engine's request id (kvaudit.request.id)")
    parser.add_argument("--replica", help="the replica that served it, where several served a request of that id")
    parser.add_argument("--trace-id", help="only the request with a span in this trace (hex)")
    parser.add_argument("--format", choices=("table", "json"), default="table", help="json: one object per page")
    parser.add_argument(
        "--model",
        help=f"the model whose prefill the misses cost: a preset ({', '.join(PRESETS)}) or a geometry JSON file;"
        " default: the preset the replica's resource names, if any",
    )
    parser.add_argument("--gpu", default="h100", help=f"a GPU profile ({', '.join(GPUS)}) or a profile JSON file")
    add_backend_option(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    # The analysis side loads only when the command runs (`kvaudit --help` loads no query engine).
    from kvaudit.analyse.explain import explain
    from kvaudit.present.explain import write_json, write_table

    paths, request_id = args.paths, args.request_id
    try:
        gpu = load_gpu(args.gpu)
        chosen = load_model(args.model) if args.model else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    with open_backend(args.backend, paths, store=args.store) as backend:
        warn_backend_read_errors(backend)
        explanations = explain(backend, request_id, replica=args.replica, trace_id=args.trace_id)
        if not explanations:
            return _not_explained(backend, request_id, args.replica)
        models = {e.replica: chosen or _declared_model(backend, e.replica) for e in explanations}
    cost = CostModel(gpu=gpu)
    for index, explanation in enumerate(explanations):
        model = models[explanation.replica]
        seconds = recompute_s(explanation, cost, model)
        if args.format == "json":
            write_json(explanation, seconds, sys.stdout)
        else:
            if index:
                print()
            write_table(explanation, seconds, _cost_note(model, cost), sys.stdout)
    return 0


# What the traces know of a request id with no page to explain, per replica.
_SEEN: Final = """
SELECT replica, count(*) FILTER (WHERE op = 'lookup') AS lookups, max(tokens_requested) AS requested,
       max(tokens_hit) AS hit, min(start_ns) AS first_ns
FROM spans
WHERE request_id = getvariable('kvaudit_request_id') AND op IN ('lookup', 'fetch', 'store')
GROUP BY replica
ORDER BY replica
"""


def _not_explained(backend: Backend, request_id: str, replica: str | None) -> int:
    """What is known of a request with no page to explain: the replicas that served it where
    `--replica` names another, or its lookups where they name no pages (LMCache's do not)."""
    _, rows = backend.query(_SEEN, {"kvaudit_request_id": request_id})
    seen = {row[0]: row for row in rows}
    if not seen:
        raise UsageError(f"request {request_id!r}: no lookup, fetch or store of it in these traces")
    if replica is not None and replica not in seen:
        served = ", ".join(visible(name) for name in seen)
        raise UsageError(f"request {request_id!r} was not served by {visible(replica)}; it was by: {served}")
    for name, lookups, requested, hit, _ in rows:
        if replica is None or name == replica:
            print(
                f"request {visible(request_id)} on {visible(name)}: {lookups} lookup(s) of"
                f" {requested if requested is not None else '?'} tokens, {hit if hit is not None else '?'} hit;"
                " its spans name no pages (LMCache's lookups do not, and it fetched and stored none),"
                " so there is no page to explain"
            )
    return 0


def recompute_s(explanation: Explanation, cost: CostModel, model: ModelGeometry | None) -> list[float | None]:
    """What prefilling each missed page costs after the tokens before it (None for hits, or with no model)."""
    return [
        None
        if model is None or page.cause.hit or page.cause in DROPPED
        else cost.prefill_s(model, page.tokens, page.token_start)
        for page in explanation.pages
    ]


def _declared_model(backend: Backend, replica: str) -> ModelGeometry | None:
    """The preset the replica's resource names as its model, if it names one."""
    _, rows = backend.query(
        "SELECT DISTINCT model FROM replicas WHERE replica = getvariable('kvaudit_replica') AND model IS NOT NULL",
        {"kvaudit_replica": replica},
    )
    names = {name for (name,) in rows}
    return next((geometry for key, geometry in PRESETS.items() if names & {key, geometry.name}), None)


def _cost_note(model: ModelGeometry | None, cost: CostModel) -> str:
    if model is None:
        return "recompute cost: the replica names no model preset (--model gives one)"
    return (
        f"recompute cost: {model.name} on {cost.gpu.name} at {cost.effective_flops / 1e12:.0f} TFLOP/s effective"
        " (the simulator's cost model, docs/boundaries.md)"
    )
