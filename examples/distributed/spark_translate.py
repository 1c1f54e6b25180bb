#!/usr/bin/env python3
"""Translate a JSONL corpus with Apache Spark, one `attn translate --format jsonl` process per
partition: the bulk path of `attn` as a stage of a real distributed engine.

    spark-submit examples/distributed/spark_translate.py --attn target/release/attn \
        --model opus-mt-en-de --input corpus.jsonl --output translated/ [--beam 4] \
        [--partitions N] [--threads-per-task T]
    # or, with pyspark installed (pip install pyspark; needs Java 17+), in local mode:
    python examples/distributed/spark_translate.py --master 'local[2]' ...

Input: one JSON object per line with "id" and "text" (other fields are passed through).
Output: a directory of JSONL part files (Spark's `saveAsTextFile`), one object per input
object — "translation", "score", "log_prob", or "error" with the reason — sorted by "id"
when `--sort-by-id` is given.

How it works. Spark reads the corpus into partitions; `mapPartitions` starts one
`attn translate --model DIR --format jsonl` process per partition (task) and streams the
partition's lines through it: `attn` sorts each window by length, batches within its token
budget and writes one output line per input line in order, so the task's outputs are its
inputs' translations in the same order, and a line that fails carries its own "error" without
failing the task. The binary and the model directory are shipped to the executors with
`SparkContext.addFile` (found there with `SparkFiles.get`), or read from a shared path with
`--shared-paths`. Each task's process runs `--threads-per-task` threads (RAYON_NUM_THREADS):
give a machine as many concurrent tasks as it has cores divided by that.

Why Spark (rather than Ray Data or Dask): the bulk path is a line-oriented process that reads
stdin and writes stdout, which is exactly what Spark's partition pipes are made for
(`RDD.pipe` / `mapPartitions` over a subprocess); Spark brings the rest a corpus job needs:
reading and writing sharded files (local, HDFS, S3), retrying a failed task on another
executor, and a scheduler that runs one process per core. Ray's actor pool would serve too, but
keeping a pool of `attn` processes alive between batches adds nothing here (the model loads in
well under a second: it is memory-mapped), and Dask's bag API is thinner on fault tolerance.
"""
import argparse
import json
import os
import subprocess
import sys
import threading


def translate_partition(lines, attn, model, beam, threads, shared):
    """Streams one partition's JSONL lines through one `attn translate` process."""
    from pyspark import SparkFiles

    if not shared:
        attn = SparkFiles.get(os.path.basename(attn))
        model = SparkFiles.get(os.path.basename(model.rstrip("/")))
        os.chmod(attn, 0o755)
    cmd = [attn, "translate", "--model", model, "--format", "jsonl", "--beam", str(beam)]
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)

    def feed():
        try:
            for line in lines:
                proc.stdin.write(line.encode("utf-8") + b"\n")
        finally:
            proc.stdin.close()

    def drain_errors(sink):
        sink.extend(proc.stderr)

    errors = []
    writer = threading.Thread(target=feed)
    reader = threading.Thread(target=drain_errors, args=(errors,))
    writer.start()
    reader.start()
    for out in proc.stdout:
        yield out.decode("utf-8").rstrip("\n")
    writer.join()
    reader.join()
    code = proc.wait()
    # Exit code 1 means some lines failed: they carry "error"; anything else is a crash.
    if code not in (0, 1):
        raise RuntimeError(f"{' '.join(cmd)} exited with {code}: {b''.join(errors).decode(errors='replace')}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--attn", required=True, help="the attn binary")
    ap.add_argument("--model", required=True, help="a model directory (e.g. opus-mt-en-de)")
    ap.add_argument("--input", required=True, help="JSONL corpus (any path Spark reads)")
    ap.add_argument("--output", required=True, help="output directory (must not exist)")
    ap.add_argument("--beam", type=int, default=1)
    ap.add_argument("--partitions", type=int, default=None, help="default: 2 per task slot")
    ap.add_argument("--threads-per-task", type=int, default=1)
    ap.add_argument("--master", default=None, help="e.g. local[2]; default: spark-submit's")
    ap.add_argument("--shared-paths", action="store_true",
                    help="--attn and --model are on a path every executor sees (no addFile)")
    ap.add_argument("--sort-by-id", action="store_true", help="write the outputs sorted by id")
    args = ap.parse_args(argv)

    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName("attn-translate")
    if args.master:
        builder = builder.master(args.master)
    spark = builder.getOrCreate()
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    attn, model = os.path.abspath(args.attn), os.path.abspath(args.model)
    if not args.shared_paths:
        sc.addFile(attn)
        sc.addFile(model, recursive=True)
    partitions = args.partitions or 2 * sc.defaultParallelism
    lines = sc.textFile(args.input, minPartitions=partitions)
    out = lines.mapPartitions(lambda it: translate_partition(
        it, attn, model, args.beam, args.threads_per_task, args.shared_paths))
    if args.sort_by_id:
        out = out.sortBy(lambda line: json.loads(line).get("id"))
    out.saveAsTextFile(args.output)
    spark.stop()


if __name__ == "__main__":
    sys.exit(main())
