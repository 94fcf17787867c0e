# Exercise 07.4: how to read the failed job's output for the rank, the line and the cause, written as a function of
# the lines ex4.check() printed ("[rank R] ..."), the way a person reads them:
# 1. A rank that raised an error of its own is the culprit; a rank whose only error is losing its peer ("Connection
#    closed by peer") or a collective that timed out ("Timed out waiting") is a victim.
# 2. When no rank raised an error of its own, the victims timed out waiting for a rank that was somewhere else: the
#    rank torchrun stopped (faulthandler's "Current thread ... (most recent call first):" dump).
# 3. The line is the innermost frame of job.py: the last one in a traceback (most recent call last), the first one
#    in a faulthandler dump (most recent call first).
VICTIM = ("Connection closed by peer", "Timed out waiting", "Connection reset")


def by_rank(printed):
    """{rank: [its lines]} from lines that begin "[rank R] "."""
    out = {}
    for text in printed.splitlines():
        if text.startswith("[rank ") and "] " in text:
            rank, line = text[len("[rank "):].split("] ", 1)
            out.setdefault(int(rank), []).append(line)
    return out


def job_lines(lines):
    """The line numbers of job.py's frames, in the order printed ('File ".../job.py", line 31 in wait_for')."""
    return [int(line.split('job.py", line ')[1].split(",")[0].split()[0]) for line in lines if 'job.py", line ' in line]


def is_error(line):  # "KeyError: 'features'", "RuntimeError: [...] Timed out waiting ..."
    return ": " in line and line.split(": ")[0].strip().endswith(("Error", "Exception"))


def answer(printed):
    """(rank, line, cause) from the printed lines."""
    ranks = by_rank(printed)
    for rank, lines in sorted(ranks.items()):
        errors = [line for line in lines if is_error(line)]
        if errors and not any(v in errors[-1] for v in VICTIM):  # an error of its own
            return rank, job_lines(lines)[-1], "python exception"
    for rank, lines in sorted(ranks.items()):
        dumps = [i for i, line in enumerate(lines) if line.startswith("Current thread")]
        if dumps:  # stopped by torchrun while the others waited in a collective
            return rank, job_lines(lines[dumps[-1]:])[0], "collective timeout"
    raise ValueError("no culprit in these lines")
