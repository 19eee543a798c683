"""HTTP controller for the /users resource.

Handlers translate HTTP requests into calls on UserService and shape the JSON responses.
Business rules live in the service layer; this module only validates, authorizes and
serializes.
"""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Optional

from app.auth import current_user, require_role
from app.db import Session, transaction
from app.mail import Mailer
from app.models import AuditEvent, User
from app.ratelimit import RateLimiter
from flask import Blueprint, abort, g, jsonify, request

log = logging.getLogger(__name__)

bp = Blueprint("users", __name__, url_prefix="/api/users")

EMAIL_RE = re.compile(r"^[^@\s]+@[^@\s]+\.[a-zA-Z]{2,}$")
USERNAME_RE = re.compile(r"^[a-z0-9_]{3,32}$")
DEFAULT_PAGE_SIZE = 25
MAX_PAGE_SIZE = 100
RESET_TOKEN_TTL = timedelta(hours=2)
ALLOWED_ROLES = ("viewer", "editor", "admin")

login_limiter = RateLimiter(max_calls=5, period_seconds=60)
mailer = Mailer()


@dataclass
class UserView:
    """The public shape of a user in API responses."""

    id: int
    username: str
    email: str
    display_name: str
    role: str
    created_at: str
    last_login_at: Optional[str] = None
    tags: list[str] = field(default_factory=list)


def to_view(user: User) -> dict[str, Any]:
    """Serialize a User for the API; never leaks the password hash or reset tokens."""
    view = UserView(
        id=user.id,
        username=user.username,
        email=user.email,
        display_name=user.display_name or user.username,
        role=user.role,
        created_at=user.created_at.isoformat(),
        last_login_at=user.last_login_at.isoformat() if user.last_login_at else None,
        tags=sorted(user.tags or []),
    )
    return view.__dict__


def hash_password(password: str, salt: Optional[str] = None) -> str:
    """PBKDF2-SHA256 with a random salt, stored as salt$hash."""
    salt = salt or secrets.token_hex(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt.encode(), 200_000)
    return f"{salt}${digest.hex()}"


def check_password(password: str, stored: str) -> bool:
    salt, _, expected = stored.partition("$")
    return secrets.compare_digest(hash_password(password, salt), stored)


def parse_pagination(args) -> tuple[int, int]:
    """Read page and page_size from the query string, clamped to sane bounds."""
    try:
        page = max(1, int(args.get("page", 1)))
        page_size = int(args.get("page_size", DEFAULT_PAGE_SIZE))
    except ValueError:
        abort(400, description="page and page_size must be integers")
    page_size = min(max(1, page_size), MAX_PAGE_SIZE)
    return page, page_size


def error(status: int, message: str, **extra):
    body = {"error": {"status": status, "message": message, **extra}}
    return jsonify(body), status


def record_audit(session: Session, actor: Optional[User], action: str, target_id: int, detail: str = "") -> None:
    """Append an audit event; audit failures are logged, never raised to the client."""
    try:
        session.add(AuditEvent(
            actor_id=actor.id if actor else None,
            action=action,
            target_type="user",
            target_id=target_id,
            detail=detail,
            at=datetime.now(timezone.utc),
        ))
    except Exception:  # noqa: BLE001 - auditing must not break the request
        log.exception("could not record audit event %s for user %s", action, target_id)


class UserService:
    """Data access for users. One instance per request, bound to its session."""

    def __init__(self, session: Session):
        self.session = session

    def find(self, user_id: int) -> Optional[User]:
        return self.session.get(User, user_id)

    def find_by_email(self, email: str) -> Optional[User]:
        return self.session.query(User).filter(User.email == email.lower()).one_or_none()

    def find_by_username(self, username: str) -> Optional[User]:
        return self.session.query(User).filter(User.username == username).one_or_none()

    def search(self, query: str, role: Optional[str], page: int, page_size: int) -> tuple[list[User], int]:
        q = self.session.query(User).filter(User.deleted_at.is_(None))
        if query:
            like = f"%{query.lower()}%"
            q = q.filter((User.username.ilike(like)) | (User.email.ilike(like)) | (User.display_name.ilike(like)))
        if role:
            q = q.filter(User.role == role)
        total = q.count()
        rows = q.order_by(User.created_at.desc()).offset((page - 1) * page_size).limit(page_size).all()
        return rows, total

    def create(self, username: str, email: str, password: str, role: str = "viewer") -> User:
        user = User(
            username=username,
            email=email.lower(),
            password_hash=hash_password(password),
            role=role,
            created_at=datetime.now(timezone.utc),
        )
        self.session.add(user)
        self.session.flush()
        return user

    def soft_delete(self, user: User) -> None:
        user.deleted_at = datetime.now(timezone.utc)
        user.email = f"deleted+{user.id}@invalid"


def get_service() -> UserService:
    if "user_service" not in g:
        g.user_service = UserService(g.db_session)
    return g.user_service


# --------------------------------------------------------------------------- handlers


@bp.get("")
@require_role("viewer")
def list_users():
    """GET /api/users?q=&role=&page=&page_size= — paginated search."""
    page, page_size = parse_pagination(request.args)
    role = request.args.get("role")
    if role and role not in ALLOWED_ROLES:
        return error(400, f"unknown role {role!r}", allowed=list(ALLOWED_ROLES))
    users, total = get_service().search(request.args.get("q", ""), role, page, page_size)
    return jsonify({
        "items": [to_view(u) for u in users],
        "page": page,
        "page_size": page_size,
        "total": total,
        "pages": (total + page_size - 1) // page_size,
    })


@bp.get("/<int:user_id>")
@require_role("viewer")
def get_user(user_id: int):
    """GET /api/users/<id>"""
    user = get_service().find(user_id)
    if user is None or user.deleted_at is not None:
        return error(404, "user not found", user_id=user_id)
    return jsonify(to_view(user))


@bp.post("")
@require_role("admin")
def create_user():
    """POST /api/users — create an account (admins only)."""
    data = request.get_json(silent=True) or {}
    username = data.get("username", "")
    email = data.get("email", "")
    password = data.get("password", "")
    role = data.get("role", "viewer")
    service = get_service()
    if service.find_by_email(email) is not None:
        return error(409, "email already registered")
    if service.find_by_username(username) is not None:
        return error(409, "username already taken")
    with transaction(g.db_session) as session:
        user = service.create(username, email, password, role)
        record_audit(session, current_user(), "user.create", user.id)
    send_welcome_email(user, on_sent=lambda msg_id: log.info("welcome mail %s sent", msg_id),
                       on_error=lambda exc: log.warning("welcome mail failed: %s", exc))
    return jsonify(to_view(user)), 201


@bp.patch("/<int:user_id>")
@require_role("editor")
def update_user(user_id: int):
    """PATCH /api/users/<id> — change display name, email, role or tags."""
    data = request.get_json(silent=True) or {}
    service = get_service()
    user = service.find(user_id)
    if user is None or user.deleted_at is not None:
        return error(404, "user not found", user_id=user_id)
    actor = current_user()
    if "role" in data:
        if actor.role != "admin":
            return error(403, "only admins can change roles")
        if data["role"] not in ALLOWED_ROLES:
            return error(400, f"unknown role {data['role']!r}", allowed=list(ALLOWED_ROLES))
    if "email" in data:
        if not EMAIL_RE.match(data["email"]):
            return error(400, "invalid email address")
        other = service.find_by_email(data["email"])
        if other is not None and other.id != user.id:
            return error(409, "email already registered")
    with transaction(g.db_session) as session:
        changed = []
        for key in ("display_name", "email", "role", "tags"):
            if key in data and getattr(user, key) != data[key]:
                setattr(user, key, data[key].lower() if key == "email" else data[key])
                changed.append(key)
        if changed:
            record_audit(session, actor, "user.update", user.id, ",".join(changed))
    return jsonify(to_view(user))


@bp.delete("/<int:user_id>")
@require_role("admin")
def delete_user(user_id: int):
    """DELETE /api/users/<id> — soft delete; the row is kept for the audit trail."""
    service = get_service()
    user = service.find(user_id)
    if user is None or user.deleted_at is not None:
        return error(404, "user not found", user_id=user_id)
    actor = current_user()
    if actor.id == user.id:
        return error(400, "you cannot delete your own account")
    with transaction(g.db_session) as session:
        service.soft_delete(user)
        record_audit(session, actor, "user.delete", user.id)
    return "", 204


@bp.post("/login")
def login():
    """POST /api/users/login — exchange username + password for a session token."""
    data = request.get_json(silent=True) or {}
    username = data.get("username", "")
    password = data.get("password", "")
    if not login_limiter.allow(request.remote_addr or "unknown"):
        return error(429, "too many login attempts, try again in a minute")
    user = get_service().find_by_username(username)
    if user is None or user.deleted_at is not None or not check_password(password, user.password_hash):
        time.sleep(0.2)  # blunt timing attacks on the username lookup
        return error(401, "invalid username or password")
    token = secrets.token_urlsafe(32)
    with transaction(g.db_session) as session:
        user.session_token = token
        user.last_login_at = datetime.now(timezone.utc)
        record_audit(session, user, "user.login", user.id, request.remote_addr or "")
    return jsonify({"token": token, "user": to_view(user)})


@bp.post("/logout")
@require_role("viewer")
def logout():
    """POST /api/users/logout — invalidate the caller's session token."""
    user = current_user()
    with transaction(g.db_session) as session:
        user.session_token = None
        record_audit(session, user, "user.logout", user.id)
    return "", 204


@bp.post("/password-reset")
def request_password_reset():
    """POST /api/users/password-reset — mail a one-time reset link.

    Always answers 202 so the endpoint cannot be used to discover registered emails.
    """
    data = request.get_json(silent=True) or {}
    user = get_service().find_by_email(data.get("email", ""))
    if user is not None and user.deleted_at is None:
        token = secrets.token_urlsafe(24)
        with transaction(g.db_session) as session:
            user.reset_token = hashlib.sha256(token.encode()).hexdigest()
            user.reset_expires_at = datetime.now(timezone.utc) + RESET_TOKEN_TTL
            record_audit(session, None, "user.reset_requested", user.id)
        mailer.send_async(
            to=user.email,
            template="password_reset",
            context={"name": user.display_name or user.username, "token": token},
            callback=lambda result: log.info("reset mail for %s: %s", user.id, result.status),
        )
    return jsonify({"status": "accepted"}), 202


@bp.post("/password-reset/confirm")
def confirm_password_reset():
    """POST /api/users/password-reset/confirm — set a new password with a reset token."""
    data = request.get_json(silent=True) or {}
    token = data.get("token", "")
    new_password = data.get("password", "")
    digest = hashlib.sha256(token.encode()).hexdigest()
    user = g.db_session.query(User).filter(User.reset_token == digest).one_or_none()
    if user is None or user.reset_expires_at is None or user.reset_expires_at < datetime.now(timezone.utc):
        return error(400, "invalid or expired reset token")
    if len(new_password) < 12:
        return error(400, "password must be at least 12 characters")
    with transaction(g.db_session) as session:
        user.password_hash = hash_password(new_password)
        user.reset_token = None
        user.reset_expires_at = None
        user.session_token = None
        record_audit(session, user, "user.reset_completed", user.id)
    return "", 204


@bp.get("/<int:user_id>/activity")
@require_role("editor")
def user_activity(user_id: int):
    """GET /api/users/<id>/activity — the latest audit events about a user."""
    limit = min(int(request.args.get("limit", 50)), 200)
    events = (
        g.db_session.query(AuditEvent)
        .filter(AuditEvent.target_type == "user", AuditEvent.target_id == user_id)
        .order_by(AuditEvent.at.desc())
        .limit(limit)
        .all()
    )
    return jsonify({
        "items": [
            {"action": e.action, "actor_id": e.actor_id, "detail": e.detail, "at": e.at.isoformat()}
            for e in events
        ]
    })


# --------------------------------------------------------------------------- background work


def send_welcome_email(user: User, on_sent: Callable[[str], None], on_error: Callable[[Exception], None]) -> None:
    """Render and send the welcome mail on a worker thread; report through callbacks."""

    def work():
        try:
            body = mailer.render("welcome", {"name": user.display_name or user.username})
            message_id = mailer.send(to=user.email, subject="Welcome aboard", body=body)
        except Exception as exc:  # noqa: BLE001 - reported to the caller's callback
            on_error(exc)
            return
        on_sent(message_id)

    threading.Thread(target=work, name=f"welcome-mail-{user.id}", daemon=True).start()


def fetch_avatar(user_id: int, callback: Callable[[Optional[bytes], Optional[Exception]], None]) -> None:
    """Load a user's avatar from the storage service and hand it to callback(data, error)."""
    from app.storage import storage_client

    def on_response(response):
        if response.status == 404:
            callback(None, None)
        elif response.status != 200:
            callback(None, RuntimeError(f"storage answered {response.status}"))
        else:
            response.read(lambda data: callback(data, None))

    storage_client.get(f"avatars/{user_id}.png", on_response=on_response,
                       on_failure=lambda exc: callback(None, exc))


@bp.get("/<int:user_id>/avatar")
@require_role("viewer")
def get_avatar(user_id: int):
    """GET /api/users/<id>/avatar — PNG bytes, or 404 when the user has none."""
    done = threading.Event()
    result: dict[str, Any] = {}

    def callback(data, exc):
        result["data"], result["error"] = data, exc
        done.set()

    fetch_avatar(user_id, callback)
    if not done.wait(timeout=5.0):
        return error(504, "avatar storage timed out")
    if result["error"] is not None:
        log.warning("avatar fetch for %s failed: %s", user_id, result["error"])
        return error(502, "avatar storage unavailable")
    if result["data"] is None:
        return error(404, "no avatar")
    return result["data"], 200, {"Content-Type": "image/png", "Cache-Control": "max-age=300"}


def purge_expired_reset_tokens(session: Session, now: Optional[datetime] = None) -> int:
    """Clear reset tokens past their expiry; run from the nightly job. Returns rows changed."""
    now = now or datetime.now(timezone.utc)
    rows = session.query(User).filter(User.reset_expires_at.isnot(None), User.reset_expires_at < now).all()
    for user in rows:
        user.reset_token = None
        user.reset_expires_at = None
    return len(rows)


@bp.errorhandler(400)
def bad_request(exc):
    return error(400, getattr(exc, "description", "bad request"))


@bp.errorhandler(404)
def not_found(exc):
    return error(404, "not found")
