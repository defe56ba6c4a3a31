"""The policy form's `options` field is JSON read by the console itself (a form percent-encodes its brackets, so
the request boundary cannot see them): options nested 1,000 levels deep are a form error beside the field, not
a RecursionError's 500."""

from __future__ import annotations

from tests.web.conftest import csrf_from


def test_options_nested_too_deep_are_a_form_error(admin):
    token = csrf_from(admin.get("/console/policies/new").text)
    form = {"name": "deep-options", "type": "fixed", "models": "m1", "options": '{"a": ' + "[" * 1000 + "]" * 1000 + "}",
            "csrf_token": token}
    answered = admin.post("/console/policies/new", data=form)
    assert answered.status_code == 400 and "levels deep" in answered.text
    assert admin.get("/api/policies/deep-options").status_code == 404
