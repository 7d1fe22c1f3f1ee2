"""The trio drivers: they read sockets, feed the sans-IO session objects of ``ddmd.session``,
carry out the commands those return, and keep time for them. No protocol decisions here.

- ``vm``        VmDriver: one VM's connections (reader, outboxes, timer, reconnect, its port)
- ``debugger``  outboxes and the record of one debugger socket
"""
