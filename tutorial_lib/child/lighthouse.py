"""torchft's lighthouse, bound to the loopback interface, for as long as the process that started it holds its stdin.

    python lighthouse.py --min-replicas 1 --heartbeat-timeout-ms 5000 --join-timeout-ms 1000 --quorum-tick-ms 100

Started by ``tutorial_lib.launcher.replicas.start_lighthouse``. It runs torchft's own server
(``torchft.coordination.LighthouseServer``, the Rust server the ``torchft_lighthouse`` command runs) on ``127.0.0.1:0``:
the ``torchft_lighthouse`` command binds ``[::]:29510``, every interface, by default, and a fixed port collides with
a second notebook. The kernel picks no port: the server binds port 0 and this program prints the address it got as its
first line (``http://127.0.0.1:PORT``). Then it waits for end of file on stdin: the kernel closes that pipe to stop
it, and so does the kernel's death, however it died (SIGKILL included), so a lighthouse never outlives its notebook.
SIGTERM and SIGINT stop it too.

torchft and the standard library only: it runs by path and imports nothing of the package.
"""

from __future__ import annotations

import argparse
import importlib.util
import signal
import sys
from pathlib import Path

LOOPBACK = "127.0.0.1"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--min-replicas", type=int, required=True, help="replica groups a quorum needs (count)")
    p.add_argument("--heartbeat-timeout-ms", type=int, required=True,
                   help="a group whose heartbeats stop this long is dropped from the next quorum (milliseconds)")
    p.add_argument("--join-timeout-ms", type=int, required=True,
                   help="how long a quorum waits for heartbeating groups that have not asked to join (milliseconds)")
    p.add_argument("--quorum-tick-ms", type=int, required=True, help="how often a pending quorum is checked (ms)")
    args = p.parse_args(argv)
    LighthouseServer = lighthouse_server_class()  # after the flags: --help works without torchft

    # SIGTERM/SIGINT raise SystemExit in the wait below, so the server is shut down in the finally.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: sys.exit(128 + signum))
    server = LighthouseServer(bind=f"{LOOPBACK}:0", min_replicas=args.min_replicas,
                              join_timeout_ms=args.join_timeout_ms, quorum_tick_ms=args.quorum_tick_ms,
                              heartbeat_timeout_ms=args.heartbeat_timeout_ms)
    try:
        # address() names the host (socket.gethostname()), which need not resolve to loopback: name 127.0.0.1.
        port = server.address().rsplit(":", 1)[1]
        print(f"http://{LOOPBACK}:{port}", flush=True)
        sys.stdin.buffer.read()  # until the starter closes the pipe, or dies
    finally:
        server.shutdown()
    return 0


def lighthouse_server_class() -> type:
    """torchft's ``LighthouseServer``, loaded from its Rust extension (``torchft/_torchft*.so``) alone when it can be.

    Importing ``torchft.coordination`` runs ``torchft/__init__.py``, which imports torch: 1.5 s of a 2-core machine
    for every lighthouse, whose server needs none of it (the extension links no libtorch: ``ldd``). Where the
    extension cannot be loaded alone (a torchft built otherwise), the package import is used.
    """
    spec = importlib.util.find_spec("torchft")  # finds the package without running its __init__
    for folder in (spec.submodule_search_locations or []) if spec else []:
        for path in sorted(Path(folder).glob("_torchft*.so")):
            try:
                ext = importlib.util.spec_from_file_location("torchft._torchft", path)
                module = importlib.util.module_from_spec(ext)
                ext.loader.exec_module(module)
                return module.LighthouseServer
            except (ImportError, AttributeError):
                break
    from torchft.coordination import LighthouseServer
    return LighthouseServer


if __name__ == "__main__":
    sys.exit(main())
