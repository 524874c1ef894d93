"""What commands print for people: cells and tables (formats), colour, admission's words (keys),
turn records (records), event and log lines, the cluster's rows and `ccsup top`'s screen. Pure:
no command, client or supervisor is imported here."""
