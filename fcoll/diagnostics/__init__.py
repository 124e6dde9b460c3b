"""Never silent: what a rank knows about a job that fails or stalls, and how it ends it.

The flight recorder's ring (`flight`) and its gathered report (`flight_report`), the node
board where each rank publishes the call it waits in (`board`), the stall watch that reads
it (`watch`) and words what it sees (`stall_report`), the excepthook that ends the job when
a rank fails (`excepthook`), and MPI errors that name the call (`mpi_errors`). Below
everything but `fcoll.runtime`: a transport records into the ring without knowing who
reads it. The public side is `fcoll.debug`.
"""
