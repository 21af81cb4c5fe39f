"""Two or more ranks meet over TCP the way torch.distributed's store does: rank 0 listens on
MASTER_PORT, every other rank connects to MASTER_ADDR:MASTER_PORT and says hello. The same on-prem
(one rank per host) and in the cloud (one rank per node of an AWS Batch multi-node parallel job)."""

import os
import socket
import time

rank, world = int(os.environ["BERTH_RANK"]), int(os.environ["BERTH_WORLD_SIZE"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
print(f"rank {rank} of {world}, master {addr}:{port}", flush=True)
if rank == 0:
    server = socket.create_server(("0.0.0.0", port))
    for _ in range(world - 1):
        conn, _ = server.accept()
        print("rank 0 heard:", conn.recv(64).decode(), flush=True)
        conn.close()
else:
    for _ in range(600):
        try:
            conn = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            time.sleep(0.1)
    else:
        raise SystemExit(f"rank {rank}: no master at {addr}:{port}")
    conn.sendall(f"hello from rank {rank}".encode())
