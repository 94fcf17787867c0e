# Exercise 14.2: how to read the failed compiled job's output for the rank, the line and the cause, written as a
# function of the lines ex2.check() printed ("[rank R] ..."), the way a person reads them:
# 1. The culprit is the rank whose error is dynamo's own (torch._dynamo.exc...); the other rank only lost its peer
#    ("Connection closed by peer") in DDP's all-reduce, or was stopped while it waited there.
# 2. Unsupported under fullgraph=True is a graph break: dynamo's "from user code:" frame, the last frame of job.py
#    printed, is the line that broke the graph. FailOnRecompileLimitHit is the recompile limit: the last frame of
#    job.py in the traceback is the call that needed one more graph.


def by_rank(printed):
    """{rank: [its lines]} from lines that begin "[rank R] "."""
    out = {}
    for text in printed.splitlines():
        if text.startswith("[rank ") and "] " in text:
            rank, line = text[len("[rank "):].split("] ", 1)
            out.setdefault(int(rank), []).append(line)
    return out


def job_lines(lines):
    """The line numbers of job.py's frames, in the order printed ('File ".../job.py", line 25, in forward')."""
    return [int(line.split('job.py", line ')[1].split(",")[0].split()[0]) for line in lines if 'job.py", line ' in line]


def answer(printed):
    """(rank, line, cause) from the printed lines."""
    for rank, lines in sorted(by_rank(printed).items()):
        text = "\n".join(lines)
        if "FailOnRecompileLimitHit" in text:
            return rank, job_lines(lines)[-1], "compile recompile limit"
        if "torch._dynamo.exc.Unsupported" in text:
            return rank, job_lines(lines)[-1], "compile graph break"
    raise ValueError("no dynamo error in these lines")
