# The report test (tests/test_report.py) opens report.html in headless Chromium. `make test`
# installs Debian's chromium where it is missing and the user is root with apt-get;
# elsewhere the test is skipped and says why.
.PHONY: chromium

chromium:
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing chromium (apt-get) for tests/test_report.py"; \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } \
			>/dev/null || echo "chromium: apt-get install failed; the browser test will skip"; \
	else echo "chromium: not installed (needs root and apt-get); the browser test will skip"; fi

test: chromium
