package main

import (
	"fmt"
	"net"
	"time"
)

// notifyWait bounds one notice to the service manager: its socket is a
// datagram socket whose queue may be full.
const notifyWait = time.Second

// notifyServiceManager tells the service manager that started the process,
// if any, how it stands: systemd's readiness protocol, one datagram of
// "KEY=value" lines (READY=1, STOPPING=1, STATUS=...) sent to the socket
// named by NOTIFY_SOCKET, a path or an "@abstract" name. With socket empty
// there is no manager to tell and nothing is sent. Under Type=notify the
// manager counts the service started only at READY=1: the units ordered
// after it wait for it to answer, and ExecReload's SIGHUP cannot arrive
// before the process has taken that signal.
func notifyServiceManager(socket, state string) error {
	if socket == "" {
		return nil
	}
	if socket[0] != '/' && socket[0] != '@' {
		return fmt.Errorf("NOTIFY_SOCKET=%q: want a path or an @abstract name", socket)
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: socket, Net: "unixgram"})
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.SetWriteDeadline(time.Now().Add(notifyWait)); err != nil {
		return err
	}
	_, err = c.Write([]byte(state))
	return err
}
