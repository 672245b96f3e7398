"""The stream wing: batches of windows of a host array fed to the devices, one idea a file.

Bottom to top: where a stream is, saved and read back (`state`); which windows each step
holds (`sampling`, pure functions of seed, step and row); the read paths (`paging`, a
mapping's pages given back; `batchreads`, io_uring; `filewindows`, reads by position);
the host buffers a group is cut into (`groups`); the next group made ready (`ahead`);
Ctrl-C held back while a reader is opened (`interrupts`); a group cut and placed
(`cutting`); the one owner of a stream's state and its lock (`owner`); the arguments
checked and the stream made (`windows`). `prefetch` is the plain stream of placed batches
`WindowStream` extends.
"""
