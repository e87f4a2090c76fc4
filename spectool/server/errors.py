"""The server's answers other than 200: `ApiError` in OpenAI's error shape (each API's own shape is
made from it: messages.error_body), and `invalid`, the 400 of a field sent with a bad value."""

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


def invalid(name: str, message: str) -> ApiError:
    return ApiError(400, f"'{name}' {message}", code=f"invalid_{name}", param=name)
