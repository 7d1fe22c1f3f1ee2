"""The sans-IO brain of one VM: inputs in, commands out, no sockets, no clock, no trio.

Layer: imports the standard library and ``ddmd.protocol`` only (a test keeps it so). The trio
drivers in ``ddmd.drive`` read sockets, feed these objects, carry out the commands they return,
and keep time for them (h11's ``Connection``, mitmproxy's layers).

- ``inputs``   what can happen to a VM session (bytes from the VM or a debugger, a debugger
               joining or leaving, a call from the API, time passing)
- ``commands`` what the session wants done (send bytes, close a debugger, reconnect, wake me at,
               resolve a call, log)
- ``vm``       VmSession: composes the parts below and dispatches each input to one
               (``lifecycle``: the state table; ``settings``: what it decides with)
- ``host``     SessionHost, all a part sees of the session; ``Own``, a request of ddmd's own
               that carries its owner. The parts: ``calls`` (API calls), ``conversation``
               (HELO, FEAT, heap info), ``poll`` (thread states), ``jvmthreads`` (a plain JVM's
               threads), ``profiling`` + ``capture`` (traces, allocations, heap dumps, the files
               they bring), ``release`` (consumers joining and leaving; DBGD or a reconnect),
               ``feed`` (the VM's chunks into the model)
- ``router``   who receives each packet from the VM, and how a debugger's commands reach it
- ``bridge``   the rules for several debuggers on one VM: event ownership, held events,
               leaving without disturbing the others (``split``: who receives which events;
               ``suspensions``: who holds which suspension, what the VM is told when one lets go)
- ``model``    identity, threads and heaps of one VM, and the snapshots the registry serves
- ``words``    the sentences a user reads when a VM lacks a feature
"""
