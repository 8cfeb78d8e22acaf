"""The reader's buffer pool: buffers come back for the next read, within its limits."""

from __future__ import annotations

from kvaudit.read.buffer_pool import BufferPool


def test_a_released_buffer_serves_the_next_read_that_fits():
    pool = BufferPool(keep=2, max_bytes=1000)
    with pool.buffer(100) as first:
        assert len(first) >= 100
    with pool.buffer(90) as again:
        assert again is first
    with pool.buffer(len(first) + 1) as larger:
        assert larger is not first and len(larger) > len(first)


def test_the_smallest_fitting_buffer_is_taken_and_only_the_largest_are_kept():
    pool = BufferPool(keep=2, max_bytes=1000)
    with pool.buffer(100), pool.buffer(200) as middle, pool.buffer(300) as large:
        pass
    with pool.buffer(10) as taken:
        assert taken is middle  # the 100-byte one was dropped: only the two largest are kept
    with pool.buffer(260) as taken:
        assert taken is large


def test_buffers_over_the_limit_are_not_kept():
    pool = BufferPool(keep=2, max_bytes=100)
    with pool.buffer(500) as huge:
        pass
    with pool.buffer(500) as other:
        assert other is not huge
