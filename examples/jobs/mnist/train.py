"""A tiny stand-in training program for the code-bundle example: it runs anywhere, with or without a
GPU, and writes a checkpoint where Berth tells it to (BERTH_OUTPUT_DIR, the job's output prefix)."""

import argparse
import json
import os
import time

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
args = parser.parse_args()
out = os.environ.get("BERTH_OUTPUT_DIR", ".")
for epoch in range(1, args.epochs + 1):
    loss = 1.0 / epoch
    print(json.dumps({"epoch": epoch, "loss": loss}), flush=True)
    time.sleep(0.1)
with open(os.path.join(out, "checkpoint.json"), "w") as fh:
    json.dump({"epochs": args.epochs, "loss": loss}, fh)
