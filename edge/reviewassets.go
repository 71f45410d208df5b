package edge

import (
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"net/http"
	"path"
	"strconv"
)

// The review page's three files, its style sheet, its one script and its
// icon (without one, every browser asks for /favicon.ico, a 404), served
// by the edge itself so the CSP can forbid anything inline or from
// elsewhere. Their URLs carry a hash of their content, so a browser may
// keep them for a day and still never use a stale one.

type asset struct {
	body        []byte
	contentType string
	version     string
}

var reviewAssets = loadAssets()

func loadAssets() map[string]asset {
	types := map[string]string{".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".svg": "image/svg+xml"}
	out := map[string]asset{}
	entries, err := fs.ReadDir(reviewFS, "review/assets")
	if err != nil {
		panic(err) // embedded: cannot fail
	}
	for _, e := range entries {
		b, err := fs.ReadFile(reviewFS, "review/assets/"+e.Name())
		if err != nil {
			panic(err)
		}
		sum := sha256.Sum256(b)
		out[e.Name()] = asset{body: b, contentType: types[path.Ext(e.Name())], version: hex.EncodeToString(sum[:6])}
	}
	return out
}

// assetURL is the versioned URL of an asset, for the templates.
func assetURL(name string) string {
	a, ok := reviewAssets[name]
	if !ok {
		panic("review asset " + name + " does not exist")
	}
	return "/review/assets/" + name + "?v=" + a.version
}

// handleReviewAsset serves a style sheet, script or icon of the review page.
func handleReviewAsset() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, ok := reviewAssets[r.PathValue("name")]
		if !ok || a.contentType == "" {
			writeText(w, http.StatusNotFound, "No such file.\n")
			return
		}
		h := w.Header()
		h.Set("Content-Type", a.contentType)
		h.Set("Content-Length", strconv.Itoa(len(a.body)))
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Cache-Control", "public, max-age=86400")
		h.Set("Content-Security-Policy", "default-src 'none'")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(a.body)
	})
}
