"""What the demo text encoder costs per call, by batch rows and padded length: the table the
text workload's batching decisions rest on.

The model alone (no server), TF 1 thread per op, as the servers of bench.text_peers run it:
CPU seconds of the whole process per call, for each padded length and number of rows, after
warm-up calls of that shape. It answers two questions of the text bench:

- how much a batch saves per row (on a CPU, little: a row's cost grows with its length and
  barely shrinks with company, so waiting for rows buys little, and the adaptive wait
  decides none);
- what a padded row costs (as much as a real one: why the rows a batch is padded with go to
  shorter queued jobs, supervisor/core/batching.py).

    python -m bench.text_costs [--lengths 16,32,64,128,256] [--rows 1,2,4,8,16,32]
                               [--seconds 1.0] [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import scratch, write
from bench.text_peers import SIZES, VOCAB

ROWS = (1, 2, 4, 8, 16, 32)


def measure(model: Path, lengths: tuple[int, ...], rows: tuple[int, ...],
            seconds: float) -> dict[str, dict[str, float]]:
    """CPU ms per call and per row for every (rows, length), each shape timed for about
    ``seconds`` of CPU (at least 3 calls)."""
    import tensorflow as tf

    fn = tf.saved_model.load(str(model)).signatures["serving_default"]
    rng = np.random.default_rng(0)
    table: dict[str, dict[str, float]] = {}
    for length in lengths:
        for n in rows:
            ids = tf.constant(rng.integers(1, VOCAB, (n, length)).astype(np.int32))
            mask = tf.ones((n, length), tf.int32)
            for _ in range(2):  # the shape's first calls allocate
                fn(input_ids=ids, attention_mask=mask)
            calls, began = 0, time.process_time()
            while calls < 3 or time.process_time() - began < seconds:
                fn(input_ids=ids, attention_mask=mask)["pooled"].numpy()
                calls += 1
            per_call = (time.process_time() - began) / calls
            table[f"{n}x{length}"] = {"rows": n, "length": length,
                                      "ms_per_call": round(per_call * 1e3, 3),
                                      "ms_per_row": round(per_call * 1e3 / n, 3)}
    return table


def one_thread() -> dict[str, int]:
    """TF 1 thread per op where this process has not run TF yet; what is in force, said."""
    import tensorflow as tf

    with contextlib.suppress(RuntimeError):  # TF already ran here (a test process)
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    return {"intra_op": tf.config.threading.get_intra_op_parallelism_threads(),
            "inter_op": tf.config.threading.get_inter_op_parallelism_threads()}


def run(lengths: tuple[int, ...], rows: tuple[int, ...], seconds: float,
        out: Path | None) -> dict[str, Any]:
    from worker import demo_text

    threads = one_thread()
    with scratch() as work:
        demo_text.save(work / "text_model")
        table = measure(work / "text_model", lengths, rows, seconds)
    header = ["padded length", *(f"{n} rows: ms/row" for n in rows),
              f"saved per row, {rows[-1]} rows against 1"]
    lines: list[list[Any]] = [header]
    for length in lengths:
        cells = [table[f"{n}x{length}"]["ms_per_row"] for n in rows]
        lines.append([length, *cells, f"{1 - cells[-1] / cells[0]:.0%}"])
    result = {"lengths": list(lengths), "rows": list(rows), "seconds": seconds,
              "tf_threads": threads, "costs": table}
    write("text_costs", result, lines, out,
          "The demo text encoder alone (`tfsupervisor demo-model --text`), TF "
          f"{threads['intra_op']} intra-op and {threads['inter_op']} inter-op thread(s): CPU "
          "ms of the whole process per call, divided by its rows; each shape warmed first, "
          f"then called for ~{seconds:g} s of CPU.")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default=",".join(map(str, SIZES)))
    parser.add_argument("--rows", default=",".join(map(str, ROWS)))
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    result = run(tuple(int(x) for x in args.lengths.split(",")),
                 tuple(int(x) for x in args.rows.split(",")), args.seconds, args.out)
    print(json.dumps(result["costs"], indent=1))


if __name__ == "__main__":
    main()
