#!/usr/bin/env python3
"""A job's own worker command that holds the launchers to their contract.

It stands for a user's script started through ``launch.worker_command``
(deploy/README.md, "The worker command"): it parses its arguments strictly
(``argparse``'s ``parse_args``, which exits 2 on any argument it does not
declare), declares only what a launcher passes (``--config``,
``--scheduler``) besides its own ``--trainer``, and writes no summary file.

It prints what the launcher gave it on stderr (one line starting with
``strict_worker:``), then becomes the C++ trainer (exec) with
``PS_SUMMARY_OUT`` removed from its environment, so the job trains for real
and nothing writes a summary. Only the standard library: any ``python3``
runs it.
"""

import argparse
import os
import sys


def main() -> None:
    """Parses the launcher's arguments strictly and execs the trainer."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trainer", required=True, help="the C++ trainer binary")
    parser.add_argument("--config", required=True, help="the job config (from the launcher)")
    parser.add_argument("--scheduler", required=True, help="host:port (from the launcher)")
    args = parser.parse_args()
    summary_out = os.environ.pop("PS_SUMMARY_OUT", "")
    print(f"strict_worker: PS_SCHEDULER={os.environ.get('PS_SCHEDULER', '')} "
          f"PS_SUMMARY_OUT={summary_out}", file=sys.stderr, flush=True)
    argv = [args.trainer, f"--config={args.config}", f"--scheduler={args.scheduler}"]
    # psnode gives the cluster sizes in the environment only.
    for variable, flag in (("PS_NUM_SERVERS", "--num_servers"),
                           ("PS_NUM_WORKERS", "--num_workers")):
        if os.environ.get(variable):
            argv.append(f"{flag}={os.environ[variable]}")
    os.execv(args.trainer, argv)


if __name__ == "__main__":
    main()
