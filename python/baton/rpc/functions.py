"""@async_execution: the function returns a torch.futures.Future, and the
reply is sent when it completes; no thread waits meanwhile."""
import functools


def async_execution(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    wrapper._baton_async_execution = True
    wrapper._wrapped_async_rpc_function = fn
    return wrapper
