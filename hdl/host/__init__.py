"""Host interface of a board: the host protocol over UDP (golden model, engine) and the
Ethernet core around it."""
