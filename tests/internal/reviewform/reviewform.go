// Package reviewform reads the review page's forms as a browser would
// submit them, for the tests that drive the page over HTTP (tests/e2e,
// tests/compose).
package reviewform

import (
	"html"
	"net/url"
	"regexp"
	"strings"
)

// Approve reads the approve form of an approval page: its hidden,
// text and number inputs, text areas and selected options, as a browser
// would submit them unchanged.
func Approve(body string) (url.Values, bool) {
	start := strings.Index(body, `<form id="approve-form"`)
	if start < 0 {
		return nil, false
	}
	end := strings.Index(body[start:], "</form>")
	if end < 0 {
		return nil, false
	}
	f := body[start : start+end]
	v := url.Values{}
	attr := func(tag, name string) (string, bool) {
		m := regexp.MustCompile(`\s` + name + `="([^"]*)"`).FindStringSubmatch(tag)
		if m == nil {
			return "", false
		}
		return html.UnescapeString(m[1]), true
	}
	for _, tag := range regexp.MustCompile(`<input [^>]*>`).FindAllString(f, -1) {
		name, ok := attr(tag, "name")
		if !ok {
			continue
		}
		if typ, _ := attr(tag, "type"); typ == "checkbox" {
			if strings.Contains(tag, " checked") {
				v.Set(name, "on")
			}
			continue
		}
		val, _ := attr(tag, "value")
		v.Set(name, val)
	}
	for _, m := range regexp.MustCompile(`(?s)<textarea [^>]*name="([^"]+)"[^>]*>\n?(.*?)</textarea>`).FindAllStringSubmatch(f, -1) {
		v.Set(m[1], html.UnescapeString(m[2]))
	}
	for _, m := range regexp.MustCompile(`(?s)<select [^>]*name="([^"]+)"[^>]*>(.*?)</select>`).FindAllStringSubmatch(f, -1) {
		if o := regexp.MustCompile(`<option value="([^"]*)"[^>]*selected`).FindStringSubmatch(m[2]); o != nil {
			v.Set(m[1], html.UnescapeString(o[1]))
		}
	}
	return v, true
}
