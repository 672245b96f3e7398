"""The stream wing: batches of windows of a host array fed to the devices, one idea a file.

Bottom to top: where a stream is, saved and read back (`state`); which windows each step
holds (`sampling`, pure functions of seed, step and row); the host buffers a group is cut
into (`groups`); the next group made ready (`ahead`); Ctrl-C held back while a reader is
opened (`interrupts`); a group cut and placed (`cutting`); the one owner of a stream's state
and its lock (`owner`); the arguments checked and the stream made (`windows`). `prefetch`
is the plain stream of placed batches `WindowStream` extends. The read paths (positional
reads, io_uring, a mapping's pages given back) are the read engine's, below both this wing
and `_io`: `devpolicy._read`.
"""
