//go:build e2e

package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/quotedprintable"
	"net"
	"net/mail"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
)

// dovecot is a real IMAP server (Debian's dovecot) on loopback, with one
// mailbox: the assistant's, with INBOX and Sent.
type dovecot struct {
	dir, conf string
	port      int
	user      string
	password  string
	cmd       *exec.Cmd
}

func startDovecot(t *testing.T, dir string) *dovecot {
	t.Helper()
	bin, err := exec.LookPath("dovecot")
	if err != nil {
		t.Fatalf("dovecot is not installed (tests/e2e/setup.sh installs Debian's dovecot-imapd): %v", err)
	}
	d := &dovecot{dir: filepath.Join(dir, "dovecot"), port: freePort(t), user: "assistant@e2e.test", password: "imap-" + randomHex(8)}
	for _, sub := range []string{"run", "state", "mail"} {
		if err := os.MkdirAll(filepath.Join(d.dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// As root, dovecot runs its login and internal processes as its own
	// users (Debian's package creates them) and the mail as user dovecot.
	loginUser, internalUser, mailUser := "dovenull", "dovecot", "dovecot"
	if os.Geteuid() != 0 {
		u, err := user.Current()
		if err != nil {
			t.Fatal(err)
		}
		loginUser, internalUser, mailUser = u.Username, u.Username, u.Username
	}
	mu, err := user.Lookup(mailUser)
	if err != nil {
		t.Fatalf("dovecot's mail user %s: %v", mailUser, err)
	}
	if err := chownR(filepath.Join(d.dir, "mail"), mu.Uid, mu.Gid); err != nil {
		t.Fatal(err)
	}
	passwd := filepath.Join(d.dir, "passwd")
	if err := os.WriteFile(passwd, []byte(d.user+":{PLAIN}"+d.password+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d.conf = filepath.Join(d.dir, "dovecot.conf")
	conf := fmt.Sprintf(`base_dir = %[1]s/run
state_dir = %[1]s/state
log_path = %[1]s/dovecot.log
protocols = imap
listen = 127.0.0.1
ssl = no
disable_plaintext_auth = no
auth_mechanisms = plain login
mail_location = maildir:%[1]s/mail/%%u
first_valid_uid = 0
default_login_user = %[3]s
default_internal_user = %[4]s
namespace inbox {
  inbox = yes
  mailbox Sent {
    special_use = \Sent
    auto = create
  }
}
passdb {
  driver = passwd-file
  args = scheme=PLAIN username_format=%%u %[1]s/passwd
}
userdb {
  driver = static
  args = uid=%[5]s gid=%[6]s home=%[1]s/mail/%%u
}
service imap-login {
  inet_listener imap {
    address = 127.0.0.1
    port = %[2]d
  }
  inet_listener imaps {
    port = 0
  }
}
service stats {
  unix_listener stats-reader {
    mode = 0666
  }
  unix_listener stats-writer {
    mode = 0666
  }
}
`, d.dir, d.port, loginUser, internalUser, mu.Uid, mu.Gid)
	if err := os.WriteFile(d.conf, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	d.cmd = exec.Command(bin, "-F", "-c", d.conf)
	d.cmd.Stdout, d.cmd.Stderr = os.Stderr, os.Stderr
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = d.cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = d.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = d.cmd.Process.Kill()
			<-done
		}
	})
	waitPort(t, d.port, 20*time.Second, "dovecot")
	return d
}

// save delivers a message into a folder of the mailbox, as the mail
// server's delivery agent does (doveadm save).
func (d *dovecot) save(folder string, msg []byte) error {
	cmd := exec.Command("doveadm", "-c", d.conf, "save", "-u", d.user, "-m", folder)
	cmd.Stdin = bytes.NewReader(msg)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("doveadm save into %s: %v: %s", folder, err, out)
	}
	return nil
}

// seen reports whether a message of a folder carries the \Seen flag: the
// IMAP trigger that reads INBOX marks what it took.
func (d *dovecot) seen(folder, messageID string) (bool, error) {
	out, err := exec.Command("doveadm", "-c", d.conf, "search", "-u", d.user,
		"mailbox", folder, "header", "Message-ID", messageID, "seen").CombinedOutput()
	if err != nil {
		return false, fmt.Errorf("doveadm search %s: %v: %s", folder, err, out)
	}
	return strings.TrimSpace(string(out)) != "", nil
}

// logins counts the IMAP logins of the mailbox's user so far.
func (d *dovecot) logins() int {
	b, _ := os.ReadFile(filepath.Join(d.dir, "dovecot.log"))
	return strings.Count(string(b), "Login: user=<"+d.user+">")
}

func chownR(dir, uid, gid string) error {
	var u, g int
	fmt.Sscan(uid, &u)
	fmt.Sscan(gid, &g)
	return filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Chown(p, u, g)
	})
}

// smtpServer is the mailbox's SMTP server: a real SMTP server (go-smtp) on
// loopback that keeps every message it accepted, byte for byte, files a
// copy of what the assistant sends into its Sent folder, as hosted
// mailboxes (Gmail, Microsoft 365) do, and delivers what is addressed to
// the assistant's own address into its INBOX. It can be stopped (the port
// refuses connections) and started again, can refuse recipients (550 at
// RCPT TO, before any data), and can drop the connection after accepting a
// message, before its answer (an "unknown" send).
type smtpServer struct {
	t        *testing.T
	port     int
	from     string
	dovecot  *dovecot
	mu       sync.Mutex
	srv      *smtp.Server
	received []received
	dropNext bool
	refused  map[string]bool
	arrived  chan received
}

type received struct {
	From string
	To   []string
	Data []byte
}

func newSMTP(t *testing.T, from string, d *dovecot) *smtpServer {
	s := &smtpServer{t: t, port: freePort(t), from: from, dovecot: d, refused: map[string]bool{}, arrived: make(chan received, 100)}
	s.start()
	t.Cleanup(s.stop)
	return s
}

func (s *smtpServer) start() {
	s.t.Helper()
	srv := smtp.NewServer(s)
	srv.Addr = fmt.Sprintf("127.0.0.1:%d", s.port)
	srv.Domain = "smtp.e2e.test"
	srv.AllowInsecureAuth = true
	srv.ReadTimeout = 30 * time.Second
	srv.WriteTimeout = 30 * time.Second
	srv.MaxMessageBytes = 10 << 20
	ln, err := net.Listen("tcp", srv.Addr)
	if err != nil {
		s.t.Fatalf("smtp listen: %v", err)
	}
	s.mu.Lock()
	s.srv = srv
	s.mu.Unlock()
	go func() { _ = srv.Serve(ln) }()
}

func (s *smtpServer) stop() {
	s.mu.Lock()
	srv := s.srv
	s.srv = nil
	s.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
}

func (s *smtpServer) messages() []received {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]received(nil), s.received...)
}

// to returns the messages accepted for a recipient.
func (s *smtpServer) to(rcpt string) []received {
	var out []received
	for _, m := range s.messages() {
		for _, r := range m.To {
			if strings.EqualFold(r, rcpt) {
				out = append(out, m)
			}
		}
	}
	return out
}

func (s *smtpServer) NewSession(c *smtp.Conn) (smtp.Session, error) {
	return &smtpSession{s: s, c: c}, nil
}

type smtpSession struct {
	s    *smtpServer
	c    *smtp.Conn
	from string
	to   []string
}

func (ss *smtpSession) Mail(from string, _ *smtp.MailOptions) error { ss.from = from; return nil }
func (ss *smtpSession) Rcpt(to string, _ *smtp.RcptOptions) error {
	ss.s.mu.Lock()
	refused := ss.s.refused[strings.ToLower(to)]
	ss.s.mu.Unlock()
	if refused {
		return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "Recipient address rejected: mailbox unavailable"}
	}
	ss.to = append(ss.to, to)
	return nil
}

// refuse makes the server refuse a recipient from now on.
func (s *smtpServer) refuse(rcpt string) {
	s.mu.Lock()
	s.refused[strings.ToLower(rcpt)] = true
	s.mu.Unlock()
}
func (ss *smtpSession) Reset()        { ss.from, ss.to = "", nil }
func (ss *smtpSession) Logout() error { return nil }

func (ss *smtpSession) Data(r io.Reader) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	m := received{From: ss.from, To: append([]string(nil), ss.to...), Data: b}
	s := ss.s
	s.mu.Lock()
	s.received = append(s.received, m)
	drop := s.dropNext
	s.dropNext = false
	s.mu.Unlock()
	if strings.EqualFold(ss.from, s.from) {
		if err := s.dovecot.save("Sent", b); err != nil {
			s.t.Errorf("file the sent copy: %v", err)
		}
	}
	for _, r := range ss.to {
		if strings.EqualFold(r, s.from) {
			if err := s.dovecot.save("INBOX", b); err != nil {
				s.t.Errorf("deliver into INBOX: %v", err)
			}
			break
		}
	}
	s.arrived <- m
	if drop {
		// Accepted and kept, and the answer never reaches the client.
		_ = ss.c.Close()
		return errors.New("connection dropped")
	}
	return nil
}

// parsed is a received message's headers and decoded text body.
type parsed struct {
	Header mail.Header
	Body   string
}

func parse(t *testing.T, m received) parsed {
	t.Helper()
	msg, err := mail.ReadMessage(bytes.NewReader(m.Data))
	if err != nil {
		t.Fatalf("a received message does not parse: %v\n%s", err, m.Data)
	}
	var body io.Reader = msg.Body
	switch strings.ToLower(msg.Header.Get("Content-Transfer-Encoding")) {
	case "quoted-printable":
		body = quotedprintable.NewReader(msg.Body)
	case "base64":
		t.Fatalf("unexpected base64 body")
	}
	b, err := io.ReadAll(body)
	if err != nil {
		t.Fatal(err)
	}
	return parsed{Header: msg.Header, Body: string(b)}
}

func (p parsed) subject(t *testing.T) string {
	s, err := new(mime.WordDecoder).DecodeHeader(p.Header.Get("Subject"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// email builds an inbound message; without msgID it has no Message-ID.
// Its Date is now unless extra holds one.
func email(msgID, from, to, subject, body string, extra ...string) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "From: %s\r\nTo: %s\r\nSubject: %s\r\nMIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n", from, to, subject)
	if !slices.ContainsFunc(extra, func(h string) bool { return strings.HasPrefix(strings.ToLower(h), "date:") }) {
		fmt.Fprintf(&b, "Date: %s\r\n", time.Now().UTC().Format(time.RFC1123Z))
	}
	if msgID != "" {
		fmt.Fprintf(&b, "Message-ID: %s\r\n", msgID)
	}
	for _, h := range extra {
		b.WriteString(h + "\r\n")
	}
	b.WriteString("\r\n" + strings.ReplaceAll(body, "\n", "\r\n") + "\r\n")
	return []byte(b.String())
}
