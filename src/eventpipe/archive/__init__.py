"""The raw archive: every processed segment, kept compressed, checksummed and seekable.

A sealed segment, once every destination has handled it, becomes four files under
``archive/YYYY-MM-DD/`` (the day it was sealed), after seed 4's "autoclaved" files::

    incoming.tok=<key>-<stamp>.log.lz4                 the events, as LZ4 frames
    incoming.tok=<key>-<stamp>.log.lz4.index.json      per frame: where, how big, which events
    incoming.tok=<key>-<stamp>.log.lz4.ids             per event: crc32 of its event id
    incoming.tok=<key>-<stamp>.log.lz4.manifest.json   sizes, sha1 and crc32 of everything

The ``.lz4`` file is a concatenation of independent LZ4 frames (the standard frame format,
so ``lz4 -d`` gives back the segment byte for byte), each of at most ``frame_events``
events. Reading one event decompresses one frame: the index says which frame holds a line,
and the ids file which line holds an event id. The manifest's checksums are what
``eventpipe archive verify`` recomputes; sha1 is a fast checksum here, not a security
measure (seed 4: LZ4 frames carry no checksum of the compressed bytes).

Segments archived before this format are ``<segment>.log.gz``: still read, and verified
by gzip's own CRC.
"""
