"""`ccsup run`'s room: the command (command), its terminal and raw mode (terminal), its stdin
forwarded to the turn (stdin_forward), the exit codes it promises a script (exits, also
`ccsup wait`'s), and the line a waiting run keeps current (wait_line). `ccsup wrap` is a run."""
