# Exercise 14.1: the all-reduces rank 0 issues in the last step of 14_1_buckets.py, for any round's variant.
# Each block holds one 512 x 512 fp32 weight: 1 MiB. After the first step DDP rebuilds its buckets in the order the
# gradients became ready (the last block's first); a bucket closes once it holds at least bucket_cap_mb, so the
# blocks fill ceil(blocks / bucket_cap_mb) buckets, each all-reduced once per step. Compiling the model does not
# change the buckets: optimize_ddp only decides where dynamo cuts the graph (at the buckets, or nowhere), and so
# whether the all-reduces can start while backward still runs.
import math


def answer(options):
    """The count for a round's flags: answer({"--blocks": "5", "--bucket-cap-mb": "2", ...}) -> 3."""
    return math.ceil(int(options["--blocks"]) / float(options["--bucket-cap-mb"]))
