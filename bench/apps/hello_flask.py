"""The Flask "hello" app bench/apps.sh serves with every WSGI server."""

from flask import Flask

app = Flask(__name__)


@app.get("/")
def hello():
    return "hello\n"
