"""Errors in OpenAI's JSON shape, with the right status."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param
        self.headers = headers

    def response(self) -> JSONResponse:
        return JSONResponse(
            {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}},
            status_code=self.status,
            headers=self.headers,
        )


def model_not_found(name: str, served: str) -> ApiError:
    return ApiError(
        404, f"the model {name!r} does not exist; this server has {served!r}", code="model_not_found", param="model"
    )


def add_error_handlers(app: FastAPI) -> None:
    """Every error in OpenAI's JSON shape: ours, a body that does not validate, an unknown route, a crash."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError) -> JSONResponse:
        return e.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        errs = e.errors()
        first = errs[0] if errs else {}
        loc = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        if first.get("type") == "json_invalid":
            return ApiError(400, "the request body is not valid JSON", code="invalid_json").response()
        msg = f"{loc}: {first.get('msg', 'invalid')}" if loc else str(first.get("msg", "invalid request"))
        return ApiError(400, msg, param=loc or None, code="invalid_value").response()

    @app.exception_handler(StarletteHTTPException)
    async def http(request: Request, e: StarletteHTTPException) -> JSONResponse:
        if e.status_code == 404:
            return ApiError(404, f"unknown route {request.method} {request.url.path}", code="not_found").response()
        if e.status_code == 405:
            return ApiError(
                405, f"method {request.method} not allowed on {request.url.path}", code="method_not_allowed"
            ).response()
        return ApiError(e.status_code, str(e.detail)).response()

    @app.exception_handler(Exception)
    async def internal(request: Request, e: Exception) -> JSONResponse:
        return ApiError(500, f"internal error: {e}", "server_error").response()
