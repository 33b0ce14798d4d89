"""Submit a noisy-neighbour workload: one heavy client's burst, then light clients.

python -m workers.producer --heavy 300 --light-clients 12 --light-docs 3
"""

from __future__ import annotations

import argparse
import time

from workers.app import app


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--heavy", type=int, default=300, help="documents the heavy client dumps")
    parser.add_argument("--light-clients", type=int, default=12)
    parser.add_argument("--light-docs", type=int, default=3, help="documents per light client")
    parser.add_argument("--pages", type=int, default=2, help="pages per document")
    parser.add_argument("--gap", type=float, default=0.1, help="seconds between light documents")
    args = parser.parse_args()

    for n in range(args.heavy):
        app.send_task(
            "workers.process_document",
            ("heavy-client", f"heavy-{n}", args.pages),
            headers={"client_id": "heavy-client"},
        )
    print(f"heavy-client: {args.heavy} documents submitted")
    for d in range(args.light_docs):
        for c in range(args.light_clients):
            client = f"light-{c:02d}"
            app.send_task(
                "workers.process_document",
                (client, f"{client}-{d}", args.pages),
                headers={"client_id": client},
            )
            time.sleep(args.gap)
    print(f"{args.light_clients} light clients: {args.light_docs} documents each submitted")


if __name__ == "__main__":
    main()
