"""A worker that parks on a staleness-0 pull (another worker stays at clock 0), for
test_signals.py: prints 'parked' before the pull, then 'interrupted' if KeyboardInterrupt
ends it; the `with` block leaves the job either way. argv: servers."""
import sys

import numpy as np

import leash

with leash.Client(sys.argv[1], name="parker", staleness=0) as c:
    t = c.create_table("t", (4, 4), optimizer="sgd", lr=1.0)
    c.push(t, np.ones((4, 4), np.float32))
    c.clock()
    print("parked", flush=True)
    try:
        c.pull(t)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        raise
print("pull returned", flush=True)
