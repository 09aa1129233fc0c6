#!/usr/bin/python3
"""A local stand-in for APNs, FCM and Google's OAuth2 token endpoint, speaking real HTTP/2
over TLS (python3-h2), for the push tests and Tools/bench-push. Loopback only.

    mock-push-service.py --cert C --key K [--apns-public-key P ...] [--fcm-public-key P] [--port 0]

Prints "listening PORT" on stdout, then one JSON object per request (a line each, flushed):
{"t": CLOCK_MONOTONIC ns at the end of the request, "conn": connection number,
 "stream": id, "path": ..., "headers": {...}, "body": "...", "auth": "ok"|"bad"|"none",
 "jwt": {"header": {...}, "claims": {...}}?, "apns_key": index of the --apns-public-key that verified, "status": status answered, 0 when left unanswered}

It checks what the real services check: the APNs provider token's ES256 signature with the
key's public half, the FCM bearer token against the tokens it issued, and the token
endpoint's RS256 assertion. Commands arrive on stdin, one JSON object per line:
  {"script": [{"status": 410, "reason": "Unregistered", "headers": {"retry-after": "2"},
               "match": "/3/device"}, ...]}   answers for the next matching requests, in order
  {"hang": true|false}                          stop answering (requests stay open) / resume
  {"goaway": true}                              graceful GOAWAY on every open connection: its
                                                last-stream-id is the highest stream answered;
                                                streams above it are refused (never recorded), and
                                                the connection closes once the client has closed
                                                it, or after 2 s (a record {"goaway": conn,
                                                "last_stream_id": N} each)
Unscripted requests get 200 (with an apns-id for APNs, a name for FCM).
"""
import argparse, base64, json, socket, ssl, sys, threading, time, uuid

import h2.config, h2.connection, h2.events, h2.exceptions, h2.settings
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, utils
from cryptography.exceptions import InvalidSignature

lock = threading.Lock()
script = []
hanging = False
issued_tokens = set()
connections = []
token_counter = 0
out_lock = threading.Lock()


def emit(record):
    with out_lock:
        sys.stdout.write(json.dumps(record, separators=(",", ":")) + "\n")
        sys.stdout.flush()


def b64d(text):
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def verify_jwt(token, key, algorithm):
    try:
        head, claims, signature = token.split(".")
        header = json.loads(b64d(head))
        body = json.loads(b64d(claims))
        raw = b64d(signature)
        signed = (head + "." + claims).encode()
        if header.get("alg") != algorithm:
            return False, header, body
        if algorithm == "ES256":
            if len(raw) != 64:
                return False, header, body
            der = utils.encode_dss_signature(int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:], "big"))
            key.verify(der, signed, ec.ECDSA(hashes.SHA256()))
        else:
            key.verify(raw, signed, padding.PKCS1v15(), hashes.SHA256())
        return True, header, body
    except (ValueError, InvalidSignature, json.JSONDecodeError):
        return False, None, None


def next_scripted(path):
    with lock:
        for index, entry in enumerate(script):
            if path.startswith(entry.get("match", "")):
                return script.pop(index)
    return None


class Connection:
    def __init__(self, sock, number, args):
        self.sock = sock
        self.number = number
        self.args = args
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        self.streams = {}
        self.send_lock = threading.Lock()
        # The highest stream answered, and whether GOAWAY went out (then nothing more is
        # processed: h2 refuses to send after GOAWAY, and a real server would not either).
        self.last_answered = 0
        self.gone_away = False

    def flush(self):
        data = self.h2.data_to_send()
        if data:
            self.sock.sendall(data)

    def run(self):
        with self.send_lock:
            self.h2.initiate_connection()
            self.h2.update_settings({h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 1000})
            self.flush()
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    return
                with self.send_lock:
                    if self.gone_away:
                        continue  # streams above last-stream-id: refused, never processed
                    events = self.h2.receive_data(data)
                    for event in events:
                        if isinstance(event, h2.events.RequestReceived):
                            self.streams[event.stream_id] = {"headers": dict(event.headers), "body": b""}
                        elif isinstance(event, h2.events.DataReceived):
                            self.streams[event.stream_id]["body"] += event.data
                            self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                        elif isinstance(event, h2.events.StreamEnded):
                            self.handle(event.stream_id, self.streams.pop(event.stream_id))
                    self.flush()
        except (OSError, h2.exceptions.ProtocolError):
            return

    def respond(self, stream_id, status, body, headers=None):
        payload = json.dumps(body).encode() if body is not None else b""
        response = [(":status", str(status)), ("content-length", str(len(payload)))]
        for name, value in (headers or {}).items():
            response.append((name, str(value)))
        self.h2.send_headers(stream_id, response, end_stream=not payload)
        if payload:
            self.h2.send_data(stream_id, payload, end_stream=True)

    def handle(self, stream_id, request):
        global token_counter
        headers = request["headers"]
        path = headers.get(":path", "")
        body = request["body"]
        record = {"t": time.monotonic_ns(), "conn": self.number, "stream": stream_id, "path": path,
                  "method": headers.get(":method"),
                  "headers": {k: v for k, v in headers.items() if not k.startswith(":")},
                  "body": body.decode("utf-8", "replace"), "auth": "none"}
        status, answer, extra = 200, None, {}
        if path.startswith("/3/device/"):
            auth = headers.get("authorization", "")
            ok, jwt_header, claims = (False, None, None)
            # Several keys: a key rotation's old and new halves; the record says which verified.
            for index, key in enumerate(self.args.apns_keys):
                if auth.lower().startswith("bearer "):
                    ok, jwt_header, claims = verify_jwt(auth[7:], key, "ES256")
                    if ok:
                        record["apns_key"] = index
                        break
            record["auth"] = "ok" if ok else "bad"
            record["jwt"] = {"header": jwt_header, "claims": claims}
            extra["apns-id"] = str(uuid.uuid4()).upper()
            if not ok:
                status, answer = 403, {"reason": "InvalidProviderToken"}
        elif path == "/token":
            form = dict(part.split("=", 1) for part in body.decode().split("&") if "=" in part)
            ok, jwt_header, claims = (False, None, None)
            if self.args.fcm_key and "assertion" in form:
                ok, jwt_header, claims = verify_jwt(form["assertion"], self.args.fcm_key, "RS256")
            record["auth"] = "ok" if ok else "bad"
            record["jwt"] = {"header": jwt_header, "claims": claims}
            record["grant_type"] = form.get("grant_type")
            if ok:
                with lock:
                    token_counter += 1
                    token = "mock-access-%d" % token_counter
                    issued_tokens.add(token)
                answer = {"access_token": token, "expires_in": 3599, "token_type": "Bearer"}
            else:
                status, answer = 400, {"error": "invalid_grant"}
        elif path.startswith("/v1/projects/"):
            auth = headers.get("authorization", "")
            with lock:
                ok = auth.startswith("Bearer ") and auth[7:] in issued_tokens
            record["auth"] = "ok" if ok else "bad"
            if ok:
                answer = {"name": path[len("/v1/"):-len(":send")] + "/messages/" + str(stream_id)}
            else:
                status, answer = 401, {"error": {"code": 401, "status": "UNAUTHENTICATED"}}
        else:
            status, answer = 404, None
        if record["auth"] != "bad":
            scripted = next_scripted(path)
            if scripted:
                status = scripted.get("status", 200)
                extra.update(scripted.get("headers", {}))
                if "reason" in scripted:
                    answer = {"reason": scripted["reason"]}
                if "fcmError" in scripted:
                    answer = {"error": {"code": status, "status": scripted.get("fcmStatus", "NOT_FOUND"), "details": [
                        {"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": scripted["fcmError"]}]}}
                if scripted.get("hang"):
                    record["status"] = 0
                    emit(record)
                    return
        with lock:
            hang = hanging
        # A request left unanswered is recorded with status 0.
        record["status"] = 0 if hang else status
        emit(record)
        if hang:
            return
        self.respond(stream_id, status, answer, extra)
        self.last_answered = max(self.last_answered, stream_id)

    def goaway(self):
        """A graceful shutdown as APNs does it: every stream up to last-stream-id has been
        answered (handle answers at once unless hanging), the later ones the client must
        send again on a new connection."""
        with self.send_lock:
            if self.gone_away:
                return
            self.gone_away = True
            try:
                self.h2.close_connection(last_stream_id=self.last_answered)
                self.flush()
            except (OSError, h2.exceptions.ProtocolError):
                pass
            emit({"goaway": self.number, "last_stream_id": self.last_answered})
        # The client closes the connection once it has no stream left on it; a client that
        # does not is cut off.
        timer = threading.Timer(2.0, self.shutdown)
        timer.daemon = True
        timer.start()

    def shutdown(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def commands():
    global hanging
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        command = json.loads(line)
        with lock:
            if "script" in command:
                script.extend(command["script"])
            if "hang" in command:
                hanging = bool(command["hang"])
        if command.get("goaway"):
            for connection in list(connections):
                connection.goaway()
        emit({"ack": command})
    # The test closed our stdin: it is done with us.
    sys.stdout.flush()
    import os
    os._exit(0)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--apns-public-key", action="append", default=[])
    parser.add_argument("--fcm-public-key")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    load = lambda path: serialization.load_pem_public_key(open(path, "rb").read()) if path else None
    args.apns_keys = [load(path) for path in args.apns_public_key]
    args.fcm_key = load(args.fcm_public_key)

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(args.cert, args.key)
    context.set_alpn_protocols(["h2"])
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", args.port))
    listener.listen(64)
    emit({"listening": listener.getsockname()[1]})
    threading.Thread(target=commands, daemon=True).start()
    number = 0
    while True:
        raw, _ = listener.accept()
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        number += 1
        emit({"connection": number})

        def serve(raw=raw, number=number):
            try:
                sock = context.wrap_socket(raw, server_side=True)
            except (ssl.SSLError, OSError) as error:
                emit({"tls_error": str(error), "conn": number})
                raw.close()
                return
            connection = Connection(sock, number, args)
            connections.append(connection)
            connection.run()
            connections.remove(connection)
            emit({"closed": number})
            sock.close()

        threading.Thread(target=serve, daemon=True).start()


if __name__ == "__main__":
    main()
