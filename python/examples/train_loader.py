"""A PyTorch training loop over a Go node's loader: the node's producer
reads, shuffles (and, with transform=augment, augments) the dataset once and
every training job on the machine iterates the same batches, each as it
would its own DataLoader.

    tensorwire import idx --images train-images-idx3-ubyte.gz --labels train-labels-idx1-ubyte.gz /data/fmnist
    tensorwire node --listen 127.0.0.1:7070 --root /tmp/tw/root --token-file /tmp/tw/token \\
        --loader fmnist,dataset=/data/fmnist,batch=64,slots=16,transform=augment,image-key=images
    python3 python/examples/train_loader.py --addr 127.0.0.1:7070 --loader fmnist --x-key images --y-key labels

Run it twice at once: both jobs train on one producer's batches.
"""

import argparse
import os
import sys
import time

try:
    import torch
    from torch import nn
except ImportError:  # pragma: no cover
    sys.exit("this example needs PyTorch (apt-get install python3-torch)")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import tensorwire  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--addr", default="127.0.0.1:7070")
    p.add_argument("--token-file", default="/tmp/tw/token")
    p.add_argument("--root", default="/tmp/tw/root", help='the node\'s root as this machine mounts it ("": by bytes)')
    p.add_argument("--loader", default="fmnist")
    p.add_argument("--x-key", default="images")
    p.add_argument("--y-key", default="labels")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--epochs", type=int, default=2)
    args = p.parse_args()

    dl = tensorwire.loader.Consumer(args.addr, args.loader, args.batch, token=tensorwire.read_token(args.token_file),
                                    root=args.root or None, as_torch=True)
    print(f"loader {args.loader!r}: mode {dl.mode}, {dl.samples} samples, {len(dl)} batches an epoch", flush=True)
    model, opt = None, None
    for _ in range(args.epochs):
        epoch, t0, total, correct, seen = dl.epoch, time.monotonic(), 0.0, 0, 0
        for batch in dl:
            x = batch[args.x_key].float().flatten(1)
            y = batch[args.y_key].long()
            if model is None:
                classes = max(int(y.max()) + 1, 2)
                model = nn.Sequential(nn.Linear(x.shape[1], 128), nn.ReLU(), nn.Linear(128, max(classes, 10)))
                opt = torch.optim.Adam(model.parameters(), lr=1e-3)
            out = model(x)
            loss = nn.functional.cross_entropy(out, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(y)
            correct += int((out.argmax(1) == y).sum())
            seen += len(y)
        print(f"epoch {epoch}: {seen} samples, loss {total / seen:.4f}, accuracy {correct / seen:.3f}, "
              f"{seen / (time.monotonic() - t0):.0f} samples/s", flush=True)
    dl.close()


if __name__ == "__main__":
    main()
