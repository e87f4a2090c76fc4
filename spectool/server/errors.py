"""The server's answers other than 200: `ApiError` in OpenAI's error shape (each API's own shape is
made from it: messages.error_body), `Overflow`, a prompt longer than the context, and `invalid`, the
400 of a field sent with a bad value."""

from __future__ import annotations


class ApiError(Exception):
    """An answer other than 200, in OpenAI's error shape."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 code: str | None = None,
                 param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.code = code
        self.param = param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "code": self.code,
                          "param": self.param}}


# what each overflow error says about the way out
RAISE_CONTEXT = ("(the server's context: `spectool serve -c/--ctx-size N` raises it, up to the "
                 "model's trained context)")


class Overflow(ApiError):
    """A prompt longer than the context, in OpenAI's words and code (`context_length_exceeded`);
    the other APIs word it their own way from `n_prompt` and `n_ctx`."""

    def __init__(self, n_prompt: int, n_ctx: int, what: str = "messages"):
        super().__init__(400, f"This model's maximum context length is {n_ctx} tokens. However, "
                              f"your {what} resulted in {n_prompt} tokens. Please reduce the "
                              f"length of the {what}. {RAISE_CONTEXT}",
                         code="context_length_exceeded", param=what)
        self.n_prompt, self.n_ctx = n_prompt, n_ctx


def invalid(name: str, message: str) -> ApiError:
    return ApiError(400, f"'{name}' {message}", code=f"invalid_{name}", param=name)
