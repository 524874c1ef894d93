"""The guards as the supervisor holds them: the handle of one running guard (`handle`: its pipes,
stdin and exit), how a guard starts (`launcher`: through guardd's zygote, else directly), what a
guard's record says of its work (`containment`, off the event loop), ending recorded work
(`reaper`), the strays of lost guards that come to the supervisor as a child subreaper (`strays`:
a guard started directly, or one whose zygote died too), and the open-file limit given back to
each turn (`fdlimit`).

Knows processes, pipes and guardd's records (through guardd.procs and guardd.record); nothing of
slots, waits or turns' states. Imports output (for the logs a handle writes) and the ground floor;
never slots, turns, admission, cluster or the daemon.
"""
