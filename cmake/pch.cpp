// Translation unit that exists only to build the shared precompiled header.
