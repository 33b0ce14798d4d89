from .ops.cli import main

main(prog_name="priority-router")
