"""The relay benchmark's harness; Benchmarks/run is its command (`bench.run.main`). Standard library
only. By concern:

    targets       the targets, peers, extra Gatehouse rows and forward-auth fronts, as data
    goals         the goals, as data, and their verdicts
    settings      the command line; run: the environment's settings and the run's state and stages
    tools         wrk, nginx, the peers (scripts/system-packages) and Gatehouse's release build
    processes     starting, waiting for and stopping processes; templates; one checked request
    references    the nginx backend and the reference proxies
    gatehouse     Gatehouse instances: configuration, start, ready, warm-up
    rounds        the interleaved wrk rounds and one measured run (CPU, RSS from /proc)
    relay, forward_auth, stack, refresh, failover
                  the targets: relay/direct/footprint; forward-auth; the sealed stack, sealed
                  targets and storm; the token endpoint and the refresh capacity; the PostgreSQL
                  failover (the end-to-end test run with the harness's binary, its figures' table)
    proc, wrk, stats
                  /proc readers; wrk's output; medians, percentiles, Results
    report, tables
                  the report and its tables
"""
