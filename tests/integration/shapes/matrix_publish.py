"""Publish the shapes matrix's noisy neighbour: a heavy client's burst, then light clients."""

from __future__ import annotations

import sys

from shapes.matrix_app import app

heavy, light = int(sys.argv[1]), int(sys.argv[2])
for n in range(heavy):
    app.send_task("matrix.process", ("heavy", f"h{n}"), headers={"client_id": "heavy"})
for n in range(light):
    app.send_task("matrix.process", (f"light{n}", f"l{n}"), headers={"client_id": f"light{n}"})
