"""Submit the noisy-neighbour workload (see ``workers.workload``) to the example workers.

python -m workers.producer --heavy 300 --light-clients 12 --light-docs 3
"""

from __future__ import annotations

import argparse

from workers.app import app
from workers.workload import NoisyNeighbour, publish


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--heavy", type=int, default=300, help="documents the heavy client dumps")
    parser.add_argument("--light-clients", type=int, default=12)
    parser.add_argument("--light-docs", type=int, default=3, help="documents per light client")
    parser.add_argument("--pages", type=int, default=2, help="pages (CPU work) per document")
    parser.add_argument("--spread", type=float, default=4.0, help="seconds the light documents span")
    args = parser.parse_args()
    workload = NoisyNeighbour(
        heavy=args.heavy,
        light_clients=args.light_clients,
        light_docs=args.light_docs,
        light_spread=args.spread,
        pages=args.pages,
    )
    published = publish(app, workload)
    print(f"{len(published)} documents submitted: {args.heavy} heavy, then light clients'")


if __name__ == "__main__":
    main()
