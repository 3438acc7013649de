"""A worker that makes one call that waits inside the C++ client, for test_signals.py:
`connect` joins the cluster at argv[1] (connect_timeout 300 s); `create_table` and
`chunk` first connect, print 'connected' and wait for a line on stdin (the test stops the
shard meanwhile), then create a table or lease a data chunk. Prints 'calling' before the
call, then 'interrupted' if KeyboardInterrupt ends it (and exits with 3, closing the
client without leaving: the shard may be stopped), or 'returned'. argv: servers, call."""
import sys

import leash

servers, call = sys.argv[1], sys.argv[2]
try:
    if call == "connect":
        print("calling", flush=True)
        leash.Client(servers, name="caller", connect_timeout=300)
    else:
        c = leash.Client(servers, name="caller", connect_timeout=30)
        print("connected", flush=True)
        sys.stdin.readline()
        print("calling", flush=True)
        if call == "create_table":
            c.create_table("t", (4, 4))
        else:
            next(iter(c.chunks(dict(num_samples=100, chunk_size=10, epochs=1))))
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(3)
print("returned", flush=True)
