"""The stream wing: batches of windows of a host array fed to the devices, one idea a file.

Bottom to top: where a stream is, saved and read back (`state`); a list of shards as one
source (`shards`); which windows each step
holds (`sampling`, pure functions of seed, step and row; `shuffling`, epochs; `mixing`,
sources by weight); documents' segments (`documents`); the read path's settings, one
record (`reading`); the host buffers a group is cut into (`groups`); Ctrl-C held back while
a reader is opened (`interrupts`); the read paths, one way a file behind one interface
(`reads`), timed against each other on the stream's own groups (`choosing`), the next
group made ready (`ahead`); a group placed (`placing`) and cut from a step by one path
(`cutting`); the one owner of a stream's state and its lock (`owner`); the arguments
checked and the stream made (`windows`). `prefetch` is the plain stream of placed batches
`WindowStream` extends. The reads themselves (positional reads, io_uring, a mapping's
pages given back) are the read engine's, below both this wing and `_io`:
`devpolicy._read`.
"""
